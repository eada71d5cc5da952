#include "engine/serve/scheduler.h"

#include <algorithm>

#include "engine/serve/api_error.h"

namespace gj::serve {

const char* finish_reason_name(Finish f) {
    switch (f) {
        case Finish::Stop:
            return "stop";
        case Finish::Length:
            return "length";
        case Finish::ToolCalls:
            return "tool_calls";
        case Finish::Cancelled:
            return "cancelled";
        case Finish::Error:
            return "error";
    }
    return "stop";
}

std::vector<JobEvent> Job::wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    std::vector<JobEvent> out(std::make_move_iterator(events_.begin()),
                              std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
}

void Job::push(JobEvent e) {
    {
        std::lock_guard lock(mu_);
        events_.push_back(std::move(e));
    }
    cv_.notify_all();
}

// One sequence and, while it runs a job, that job's generation state.
struct Scheduler::Slot {
    std::unique_ptr<gen::Forward> forward;
    std::vector<int32_t> cached;  // the tokens whose KV the sequence holds (== its positions)

    std::shared_ptr<Job> job;  // null: free
    std::unique_ptr<sample::Sampler> sampler;
    std::unique_ptr<tok::StreamDecoder> decoder;
    std::unique_ptr<OutputParser> parser;
    std::unique_ptr<StopStrings> stops;
    gen::Readout readout;
    size_t prefill_pos = 0;  // prompt tokens already in the sequence
    bool decoding = false;
    int32_t pending = -1;  // sampled, not yet run through the forward
    Usage usage;
    uint64_t prefilled = 0, generated = 0;  // this round, for the stats
};

Scheduler::Scheduler(const tok::Tokenizer& tokenizer,
                     std::vector<std::unique_ptr<gen::Forward>> sequences, SchedulerOptions options,
                     gen::BatchDecoder* batch)
    : tokenizer_(tokenizer), options_(options), batch_(batch ? batch : &sequential_) {
    if (sequences.empty()) throw std::invalid_argument("the scheduler needs at least one sequence");
    context_ = sequences[0]->context_length();
    if (options_.context > 0) context_ = std::min(context_, options_.context);
    if (options_.prefill_chunk < 1) options_.prefill_chunk = 1;
    for (auto& s : sequences) {
        auto slot = std::make_unique<Slot>();
        slot->forward = std::move(s);
        slots_.push_back(std::move(slot));
    }
    for (std::string_view m :
         {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|\"|>"}) {
        marker_ids_.push_back(tokenizer_.find(m));
    }
    stats_.slots = static_cast<int>(slots_.size());
    stats_.kv_capacity = static_cast<int64_t>(slots_.size()) * context_;
    thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() {
    stop();
}

std::shared_ptr<Job> Scheduler::submit(GenJob g) {
    if (g.prompt.empty()) throw ApiError(400, "the prompt is empty (no tokens)");
    if (g.prompt.size() >= static_cast<size_t>(context_)) {
        throw ApiError(400,
                       "the prompt has " + std::to_string(g.prompt.size()) +
                           " tokens but the context holds " + std::to_string(context_) +
                           ", leaving no room to generate; shorten the prompt",
                       "messages", "context_length_exceeded");
    }
    for (int32_t t : g.prompt) {
        if (t < 0 || t >= tokenizer_.vocab_size()) {
            throw ApiError(400, "prompt token " + std::to_string(t) + " is outside the vocabulary");
        }
    }
    auto job = std::make_shared<Job>(std::move(g));
    {
        std::lock_guard lock(mu_);
        if (stopping_) throw ApiError(503, "the server is shutting down", "", "", "server_error");
        queue_.push_back(job);
        stats_.queued = static_cast<int>(queue_.size());
    }
    cv_.notify_all();
    return job;
}

void Scheduler::cancel(const std::shared_ptr<Job>& job) {
    job->cancelled_ = true;
    cv_.notify_all();
}

void Scheduler::stop() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
    std::lock_guard lock(mu_);
    return stats_;
}

void Scheduler::admit(std::unique_lock<std::mutex>&) {
    while (!queue_.empty()) {
        std::shared_ptr<Job> job = queue_.front();
        if (job->cancelled()) {
            queue_.pop_front();
            job->push({{}, true, Finish::Cancelled, {}, ""});
            continue;
        }
        // The free slot whose cached tokens share the longest prefix with the prompt.
        Slot* best = nullptr;
        size_t best_common = 0;
        for (auto& s : slots_) {
            if (s->job) continue;
            const auto& p = job->gen.prompt;
            const size_t n = std::min(s->cached.size(), p.size());
            size_t common = 0;
            while (common < n && s->cached[common] == p[common]) ++common;
            if (!best || common > best_common) best = s.get(), best_common = common;
        }
        if (!best) return;
        queue_.pop_front();
        Slot& s = *best;
        // At least the last prompt token runs again: its logits pick the first new token.
        int keep = static_cast<int>(std::min(best_common, job->gen.prompt.size() - 1));
        if (keep < s.forward->position() && !s.forward->rewind(keep)) {
            s.forward->rewind(0);
            keep = 0;
        }
        s.cached.resize(static_cast<size_t>(keep));
        s.job = job;
        s.sampler = std::make_unique<sample::Sampler>(job->gen.sampling);
        s.decoder = std::make_unique<tok::StreamDecoder>(tokenizer_);
        s.parser = std::make_unique<OutputParser>(job->gen.tools);
        if (!job->gen.reply_prefix.empty()) {
            ParsedDelta d = s.parser->push_rendered(job->gen.reply_prefix);
            if (!d.empty()) job->push({std::move(d), false, Finish::Stop, {}, ""});
        }
        s.stops = std::make_unique<StopStrings>(job->gen.stop);
        s.readout =
            s.forward->reduces_on_device() ? gen::readout_for(job->gen.sampling) : gen::Readout{};
        s.prefill_pos = static_cast<size_t>(keep);
        s.decoding = false;
        s.pending = -1;
        s.usage = {};
        s.usage.prompt_tokens = static_cast<int>(job->gen.prompt.size());
        s.usage.cached_tokens = keep;
    }
}

void Scheduler::run() {
    for (;;) {
        std::vector<Slot*> active;
        {
            std::unique_lock lock(mu_);
            auto busy = [&] {
                return std::any_of(slots_.begin(), slots_.end(),
                                   [](auto& s) { return s->job != nullptr; });
            };
            auto free = [&] {
                return std::any_of(slots_.begin(), slots_.end(),
                                   [](auto& s) { return s->job == nullptr; });
            };
            cv_.wait(lock, [&] { return stopping_ || busy() || (!queue_.empty() && free()); });
            if (stopping_) break;
            admit(lock);
            stats_.queued = static_cast<int>(queue_.size());
            for (auto& s : slots_) {
                if (s->job) active.push_back(s.get());
            }
        }
        // A client that went away frees its slot now, before any more work is spent on it.
        std::erase_if(active, [&](Slot* s) {
            if (!s->job->cancelled()) return false;
            finish(*s, Finish::Cancelled);
            return true;
        });
        const auto t0 = std::chrono::steady_clock::now();
        step_all(active);
        const double dt =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard lock(mu_);
        for (Slot* s : active) count(*s);  // (a finished slot was counted before its done event)
        stats_.busy_seconds += dt;
        if (round_generated_) stats_.decode_seconds += dt;
        round_generated_ = false;
        stats_.slots_busy = 0;
        stats_.kv_tokens = 0;
        for (auto& s : slots_) {
            stats_.slots_busy += s->job ? 1 : 0;
            stats_.kv_tokens += s->forward->position();
        }
    }
    // Stopping: nothing new starts; everyone waiting hears that their request was cancelled.
    for (auto& s : slots_) {
        if (s->job) finish(*s, Finish::Cancelled);
    }
    std::lock_guard lock(mu_);
    for (auto& job : queue_) job->push({{}, true, Finish::Cancelled, {}, ""});
    queue_.clear();
}

void Scheduler::step_all(std::span<Slot* const> active) {
    std::vector<Slot*> decoding;
    for (Slot* s : active) {
        if (s->decoding) {
            decoding.push_back(s);
            continue;
        }
        try {
            prefill_step(*s);
        } catch (const std::exception& e) {
            finish(*s, Finish::Error, e.what());
        }
    }
    if (!decoding.empty()) decode_step(decoding);
}

void Scheduler::prefill_step(Slot& s) {
    const GenJob& g = s.job->gen;
    const size_t n =
        std::min(static_cast<size_t>(options_.prefill_chunk), g.prompt.size() - s.prefill_pos);
    std::span<const int32_t> chunk(g.prompt.data() + s.prefill_pos, n);
    const gen::StepResult r = s.forward->prefill_step(chunk, s.readout);
    s.cached.insert(s.cached.end(), chunk.begin(), chunk.end());
    s.prefill_pos += n;
    s.prefilled += n;
    if (s.prefill_pos < g.prompt.size()) return;
    for (int32_t t : g.prompt) s.sampler->accept(t);  // the penalty window sees the prompt
    s.decoding = true;
    after_step(s, r);
}

void Scheduler::decode_step(std::span<Slot* const> slots) {
    std::vector<gen::BatchEntry> batch;
    for (Slot* s : slots) batch.push_back({s->forward.get(), s->pending, s->readout});
    std::vector<gen::StepResult> results;
    try {
        results = batch_->decode_batch(batch);
    } catch (const std::exception& e) {
        if (slots.size() == 1) return finish(*slots[0], Finish::Error, e.what());
        // Again one slot at a time, so the error ends only the request that causes it. A
        // sequence the failed batch did advance (a decoder that runs entries one by one) lost
        // its result: that request ends with the error.
        for (Slot* s : slots) {
            if (s->forward->position() != static_cast<int>(s->cached.size()))
                finish(*s, Finish::Error, e.what());
            else
                decode_step({&s, 1});
        }
        return;
    }
    for (size_t i = 0; i < slots.size(); ++i) {
        slots[i]->cached.push_back(slots[i]->pending);
        after_step(*slots[i], results[i]);
    }
}

void Scheduler::after_step(Slot& s, const gen::StepResult& r) {
    const GenJob& g = s.job->gen;
    if (g.max_tokens >= 0 && s.usage.completion_tokens >= g.max_tokens)
        return finish(s, Finish::Length);
    const int32_t next = gen::sample_step(*s.sampler, r);
    if (tok::Tokenizer::is_stop_token(next)) {
        return finish(s, s.parser->tool_calls() > 0 ? Finish::ToolCalls : Finish::Stop);
    }
    s.sampler->accept(next);
    ++s.usage.completion_tokens;
    ++s.generated;
    emit_token(s, next);
    if (s.stops->matched()) return finish(s, Finish::Stop);
    // The last token allowed is out: no forward step for it.
    if (g.max_tokens >= 0 && s.usage.completion_tokens >= g.max_tokens)
        return finish(s, Finish::Length);
    // The next decode would run `next` at position cached.size(): there must be one left.
    if (s.cached.size() >= static_cast<size_t>(context_)) return finish(s, Finish::Length);
    s.pending = next;
}

void Scheduler::emit_token(Slot& s, int32_t token) {
    ParsedDelta d;
    auto m = std::find(marker_ids_.begin(), marker_ids_.end(), token);
    if (s.job->gen.parse_chat && token >= 0 && m != marker_ids_.end()) {
        d = s.parser->push_marker(static_cast<Marker>(m - marker_ids_.begin()));
    } else if (s.job->gen.parse_chat) {
        d = s.parser->push_text(s.decoder->push(token));
    } else {
        d.content = s.decoder->push(token);
    }
    d.content = s.stops->push(d.content);
    if (!d.empty()) s.job->push({std::move(d), false, Finish::Stop, {}, ""});
}

void Scheduler::count(Slot& s) {
    stats_.prompt_tokens += s.prefilled;
    stats_.generated_tokens += s.generated;
    round_generated_ = round_generated_ || s.generated > 0;
    s.prefilled = s.generated = 0;
}

void Scheduler::finish(Slot& s, Finish why, const std::string& error) {
    JobEvent last;
    if (why != Finish::Cancelled && why != Finish::Error) {
        // Flush what the decoder, the parser and the stop strings still hold.
        std::string tail = s.decoder->finish();
        if (s.job->gen.parse_chat) {
            last.delta = s.parser->push_text(tail);
            last.delta.append(s.parser->finish());
        } else {
            last.delta.content = tail;
        }
        last.delta.content = s.stops->push(last.delta.content);
        last.delta.content += s.stops->finish();
    }
    if (why == Finish::Error) {  // the sequence's state is unknown: start it over
        s.forward->rewind(0);
        s.cached.clear();
    }
    last.done = true;
    last.finish = why;
    last.usage = s.usage;
    last.error = error;
    {
        // The stats include this job's tokens by the time its requester hears it is done.
        std::lock_guard lock(mu_);
        count(s);
    }
    s.job->push(std::move(last));
    s.job.reset();
    s.sampler.reset();
    s.decoder.reset();
    s.parser.reset();
    s.stops.reset();
    s.decoding = false;
}

}  // namespace gj::serve
