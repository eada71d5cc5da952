// The slot scheduler of `gemmajit serve`: N slots, each an independent sequence (its own KV
// cache) over one loaded model, run by one thread. Each round the thread admits queued jobs into
// free slots, then runs one step of every active slot, a prefill chunk or a decode token, so
// streams interleave and a long prompt never stalls the others for longer than a chunk.
//
// A round is step_all(): a prefill chunk for every slot still reading its prompt, then ONE
// batched decode step over every decoding slot (on the GPU one forward pass whose weights are
// read once for all of them: continuous batching). A new request's prompt is thus prefilled
// between decode steps, and running streams keep flowing.
//
// A slot keeps the tokens whose keys and values its sequence holds after its job ends; a new job
// whose prompt extends them (the next turn of a chat) goes to that slot and prefills only what is
// new. Results travel to the requester through its Job, a thread-safe event queue, so the
// scheduler thread never blocks on a client.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/generate/generate.h"
#include "engine/serve/output_parser.h"
#include "engine/serve/stop_strings.h"
#include "engine/text/sampler.h"
#include "engine/text/tokenizer.h"

namespace gj::serve {

enum class Finish { Stop, Length, ToolCalls, Cancelled, Error };
const char* finish_reason_name(Finish f);  // OpenAI's finish_reason ("stop", "length", ...)

struct Usage {
    int prompt_tokens = 0;
    int completion_tokens = 0;
    int cached_tokens = 0;  // prompt tokens whose KV a slot already held
};

// A tokenized request, as the scheduler runs it.
struct GenJob {
    std::vector<int32_t> prompt;
    sample::SamplerParams sampling;
    int max_tokens = -1;  // < 0: until a stop token or the end of the context
    std::vector<std::string> stop;
    bool parse_chat = false;  // split thinking and tool calls (chat); else all text is content
    bool tools = false;       // recognize tool calls
    // The reply's forced beginning (ChatRequest::reply_prefix), already the end of `prompt`: the
    // parser reads it before the first generated token.
    std::string reply_prefix;
};

struct JobEvent {
    ParsedDelta delta;
    bool done = false;
    Finish finish = Finish::Stop;
    Usage usage;        // with done
    std::string error;  // with Finish::Error
};

// One request's link between the HTTP handler and the scheduler thread.
class Job {
  public:
    explicit Job(GenJob g) : gen(std::move(g)) {}
    const GenJob gen;

    // Waits up to `timeout` for events; returns them (empty on timeout).
    std::vector<JobEvent> wait(std::chrono::milliseconds timeout);
    bool cancelled() const { return cancelled_.load(); }

  private:
    friend class Scheduler;
    void push(JobEvent e);
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<JobEvent> events_;
    std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
    int context = 0;         // tokens per sequence; 0 or more than the forward's: the forward's
    int prefill_chunk = 64;  // prompt tokens per prefill step of one slot
};

struct SchedulerStats {
    uint64_t prompt_tokens = 0;     // prefilled (cached prompt tokens not counted)
    uint64_t generated_tokens = 0;  // sampled
    double busy_seconds = 0;        // time spent in steps
    double decode_seconds = 0;      // time in steps that generated a token
    int queued = 0;
    int slots_busy = 0;
    int slots = 0;
    int64_t kv_tokens = 0;  // positions held over all slots
    int64_t kv_capacity = 0;
};

class Scheduler {
  public:
    // `sequences`: one Forward per slot, all over the same loaded model, each at position 0;
    // `batch` decodes several of them in one step (null: one after the other). Both must
    // outlive the scheduler.
    Scheduler(const tok::Tokenizer& tokenizer, std::vector<std::unique_ptr<gen::Forward>> sequences,
              SchedulerOptions options = {}, gen::BatchDecoder* batch = nullptr);
    ~Scheduler();  // stop()
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    int context() const { return context_; }
    // Queues a job. Throws ApiError(400) for a prompt that does not fit the context (naming both
    // sizes) or a token outside the vocabulary, ApiError(503) once stopping.
    std::shared_ptr<Job> submit(GenJob job);
    // The requester is gone: its slot is freed before the next round (a queued job never runs).
    void cancel(const std::shared_ptr<Job>& job);
    // Cancels every queued and running job (each gets a done event with Finish::Cancelled) and
    // joins the thread.
    void stop();
    SchedulerStats stats() const;

  private:
    struct Slot;
    void run();
    void admit(std::unique_lock<std::mutex>& lock);
    // One round: a prefill chunk of each prefilling slot, then one batched decode step of the
    // decoding ones (see the header comment).
    void step_all(std::span<Slot* const> active);
    // A prefill chunk of `slot`; once its whole prompt is in, samples the first token.
    void prefill_step(Slot& slot);
    // The decode step of every slot in `slots` in one batch; a batch that fails is run again one
    // slot at a time, so an error ends only the request that caused it.
    void decode_step(std::span<Slot* const> slots);
    // After a forward step of `slot`: samples, emits and checks the stop conditions.
    void after_step(Slot& slot, const gen::StepResult& result);
    void emit_token(Slot& slot, int32_t token);
    void finish(Slot& slot, Finish why, const std::string& error = "");
    // Moves the slot's token counts of this round into the stats (mu_ held).
    void count(Slot& slot);

    const tok::Tokenizer& tokenizer_;
    SchedulerOptions options_;
    gen::SequentialBatchDecoder sequential_;
    gen::BatchDecoder* batch_;
    int context_ = 0;
    std::vector<std::unique_ptr<Slot>> slots_;
    std::vector<int32_t> marker_ids_;  // token id of each Marker, in enum order (-1: none)

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    bool stopping_ = false;
    SchedulerStats stats_;          // under mu_
    bool round_generated_ = false;  // under mu_: this round produced a token
    std::thread thread_;
};

}  // namespace gj::serve
