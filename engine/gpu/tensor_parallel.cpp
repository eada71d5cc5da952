#include "engine/gpu/tensor_parallel.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "engine/gpu/shard_plan.h"
#include "jit/cuda_driver.h"
#include "jit/device.h"
#include "jit/env_flags.h"
#include "jit/nccl_device.h"

namespace gj::gemma4 {

namespace {

std::string exit_text(int status) {
    if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
    return fmt::format("wait status {}", status);
}

// Writes / reads exactly n bytes (through interruptions and short transfers).
bool write_all(int fd, const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t w = ::write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w, n -= size_t(w);
    }
    return true;
}
bool read_all(int fd, void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
        const ssize_t r = ::read(fd, c, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        c += r, n -= size_t(r);
    }
    return true;
}

}  // namespace

SymmetricBuffer::SymmetricBuffer(const TensorParallel& tp, uint64_t bytes)
    : nccl_(tp.nccl), comm_(tp.comm), bytes_(bytes) {
    if (!nccl_ || !comm_ || !nccl_->has_windows()) return;
    const uint64_t whole = bytes + 16;  // the barrier's byte, kept 16-byte aligned
    ptr_ = nccl_->mem_alloc(whole);
    try {
        win_ = nccl_->register_window(comm_, ptr_, whole);
    } catch (...) {
        release();
        throw;
    }
    if (!win_) release();  // no symmetric support on this communicator
}

SymmetricBuffer::~SymmetricBuffer() {
    release();
}

SymmetricBuffer& SymmetricBuffer::operator=(SymmetricBuffer&& o) noexcept {
    if (this != &o) {
        release();
        nccl_ = std::exchange(o.nccl_, nullptr);
        comm_ = std::exchange(o.comm_, nullptr);
        win_ = std::exchange(o.win_, nullptr);
        ptr_ = std::exchange(o.ptr_, 0);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

void SymmetricBuffer::release() {
    if (!nccl_) return;
    nccl_->deregister_window(comm_, win_);
    nccl_->mem_free(ptr_);
    win_ = nullptr;
    ptr_ = 0;
}

DeviceComm::DeviceComm(const TensorParallel& tp, int lsa_barriers)
    : nccl_(tp.nccl), comm_(tp.comm), bytes_(tp.nccl->dev_comm_create(tp.comm, lsa_barriers)) {}

DeviceComm::~DeviceComm() {
    if (nccl_) nccl_->dev_comm_destroy(comm_, bytes_);
}

DeviceComm& DeviceComm::operator=(DeviceComm&& o) noexcept {
    if (this != &o) {
        if (nccl_) nccl_->dev_comm_destroy(comm_, bytes_);
        nccl_ = std::exchange(o.nccl_, nullptr);
        comm_ = std::exchange(o.comm_, nullptr);
        bytes_ = std::exchange(o.bytes_, {});
    }
    return *this;
}

// Rank 0's watch over the workers: a thread polling their exit (they are this process's
// children). A worker that fails while rank 0 still runs ends the whole run.
struct RankGroup::Watch {
    std::vector<pid_t> pids;
    std::vector<int> status;  // per worker; -1 while it runs
    std::atomic<bool> finishing{false};
    std::mutex mu;
    std::thread thread;

    // SIGKILL to the workers not reaped yet (a reaped pid may belong to another process now).
    void kill_running() {
        std::lock_guard<std::mutex> lock(mu);
        for (size_t i = 0; i < pids.size(); ++i)
            if (status[i] == -1) ::kill(pids[i], SIGKILL);
    }

    void run() {
        size_t left = pids.size();
        while (left > 0) {
            for (size_t i = 0; i < pids.size(); ++i) {
                int st = 0;
                {
                    std::lock_guard<std::mutex> lock(mu);
                    if (status[i] != -1) continue;
                }
                const pid_t r = ::waitpid(pids[i], &st, WNOHANG);
                if (r == 0) continue;
                if (r < 0) st = 0x7f00;  // not ours any more: count as failed (exit 127)
                {
                    std::lock_guard<std::mutex> lock(mu);
                    status[i] = st;
                }
                --left;
                const bool ok = r > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
                // A worker that ends before rank 0 does is trouble while rank 0 still runs: it
                // may sit in a collective that can never complete now. A moment for rank 0 to
                // fail on its own first (the same bad input usually stops every rank, and rank
                // 0's own message says more); a worker that succeeded normally ends just before
                // rank 0 finishes, so that one gets longer.
                const int grace_ms = ok ? 30000 : 3000;
                for (int t = 0; t < grace_ms && !finishing.load(); t += 30)
                    std::this_thread::sleep_for(std::chrono::milliseconds(30));
                if (!finishing.load()) {
                    std::fflush(stdout);
                    std::fprintf(stderr,
                                 "gemmajit: error: tensor-parallel rank %zu (GPU %zu) stopped "
                                 "(%s) before the run ended; stopping every rank\n",
                                 i + 1, i + 1, exit_text(st).c_str());
                    kill_running();
                    ::_exit(1);
                }
            }
            if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
};

RankGroup::RankGroup(int ranks) : ranks_(ranks) {
    if (ranks < 1 || ranks > kMaxTensorParallel)
        throw std::invalid_argument(fmt::format("--tp {}: the model is split over 1 to {} GPUs",
                                                ranks, kMaxTensorParallel));
    if (ranks == 1) return;
    // The workers' exit statuses are collected here (an inherited SIG_IGN would discard them),
    // and a write to a worker that is gone is an error to report, not a signal that kills.
    ::signal(SIGCHLD, SIG_DFL);
    ::signal(SIGPIPE, SIG_IGN);
    std::fflush(stdout);
    std::fflush(stderr);
    std::vector<int> read_ends;
    for (int r = 1; r < ranks; ++r) {
        int fds[2];
        if (::pipe(fds) != 0)
            throw std::runtime_error(
                fmt::format("pipe for tensor-parallel rank {}: {}", r, std::strerror(errno)));
        read_ends.push_back(fds[0]);
        id_pipes_.push_back(fds[1]);
    }
    const pid_t leader = ::getpid();
    std::vector<pid_t> workers;  // rank r's at r - 1
    for (int r = 1; r < ranks; ++r) {
        const pid_t pid = ::fork();
        if (pid < 0)
            throw std::runtime_error(
                fmt::format("fork for tensor-parallel rank {}: {}", r, std::strerror(errno)));
        if (pid == 0) {
            // A worker: dies with rank 0, prints nothing on stdout, keeps only its own read end.
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (::getppid() != leader) ::_exit(1);
            const int devnull = ::open("/dev/null", O_WRONLY);
            if (devnull >= 0) {
                ::dup2(devnull, STDOUT_FILENO);
                ::close(devnull);
            }
            for (int fd : id_pipes_) ::close(fd);
            for (size_t i = 0; i < read_ends.size(); ++i)
                if (int(i) + 1 != r) ::close(read_ends[i]);
            rank_ = r;
            id_pipes_ = {read_ends[size_t(r - 1)]};
            return;
        }
        workers.push_back(pid);
    }
    for (int fd : read_ends) ::close(fd);
    watch_ = new Watch();
    watch_->pids = workers;
    watch_->status.assign(workers.size(), -1);
    // The watch thread takes no signals: they stay the command's to handle (the server waits for
    // SIGINT/SIGTERM in a thread of its own, which only works while no thread leaves them
    // unblocked).
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &previous);
    watch_->thread = std::thread([w = watch_] { w->run(); });
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

RankGroup::~RankGroup() {
    for (int fd : id_pipes_) ::close(fd);
    if (!watch_) return;
    // Rank 0 leaving without finish() (an error): the workers cannot finish without it.
    if (!watch_->finishing.exchange(true)) watch_->kill_running();
    watch_->thread.join();
    delete watch_;
}

TensorParallel RankGroup::connect(const jit::Flags& flags) {
    TensorParallel tp;
    tp.rank = rank_;
    tp.ranks = ranks_;
    if (ranks_ == 1) return tp;
    std::string why;
    if (!jit::device_available(&why))
        throw jit::DeviceUnavailable("tensor parallelism needs GPUs: " + why);
    int count = 0;
    jit::check_driver(jit::driver().cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count < ranks_)
        throw jit::DeviceUnavailable(
            fmt::format("--tp {} splits the model over GPUs 0..{}, and this machine has {} GPU{}",
                        ranks_, ranks_ - 1, count, count == 1 ? "" : "s"));
    jit::Device::select(rank_);
    jit::Device::get().make_current();
    tp.nccl = &jit::Nccl::get(flags);
    jit::Nccl::UniqueId id{};
    if (rank_ == 0) {
        id = tp.nccl->unique_id();
        for (int fd : id_pipes_)
            if (!write_all(fd, id.data(), id.size()))
                throw std::runtime_error(
                    fmt::format("handing the NCCL rendezvous to a tensor-parallel rank: {}",
                                std::strerror(errno)));
    } else {
        if (!read_all(id_pipes_[0], id.data(), id.size()))
            throw std::runtime_error(
                "tensor-parallel rank 0 stopped before handing out the NCCL rendezvous");
    }
    tp.comm = tp.nccl->init_rank(ranks_, id, rank_);
    return tp;
}

void RankGroup::send(std::span<const int32_t> record) {
    const uint32_t words = uint32_t(record.size());
    for (size_t i = 0; i < id_pipes_.size(); ++i)
        if (!write_all(id_pipes_[i], &words, sizeof words) ||
            !write_all(id_pipes_[i], record.data(), record.size_bytes()))
            throw std::runtime_error(
                fmt::format("tensor-parallel rank {} no longer takes commands: {}", i + 1,
                            std::strerror(errno)));
}

bool RankGroup::receive(std::vector<int32_t>& record) {
    uint32_t words = 0;
    if (id_pipes_.empty() || !read_all(id_pipes_[0], &words, sizeof words)) return false;
    record.resize(words);
    if (!read_all(id_pipes_[0], record.data(), record.size() * sizeof(int32_t)))
        throw std::runtime_error("tensor-parallel rank 0 stopped in the middle of a command");
    return true;
}

void RankGroup::finish() {
    if (!watch_) return;
    for (int fd : id_pipes_) ::close(fd);  // the workers' command streams end
    id_pipes_.clear();
    watch_->finishing.store(true);
    watch_->thread.join();
    std::string failed;
    for (size_t i = 0; i < watch_->pids.size(); ++i) {
        const int st = watch_->status[i];
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
        failed += fmt::format("{}rank {} ({})", failed.empty() ? "" : ", ", i + 1, exit_text(st));
    }
    delete watch_;
    watch_ = nullptr;
    if (!failed.empty()) throw std::runtime_error("tensor-parallel workers failed: " + failed);
}

std::optional<FusedNormPlan> fused_norm_plan(const jit::Flags& flags, const jit::Nccl* nccl,
                                             std::string* why) {
    auto off = [&](std::string text) -> std::optional<FusedNormPlan> {
        if (why) *why = std::move(text);
        return std::nullopt;
    };
    if (!flags.get_bool("GEMMAJIT_TP_FUSED_NORM")) return off("GEMMAJIT_TP_FUSED_NORM=0");
    if (!flags.get_bool("GEMMAJIT_TP_SYMMETRIC")) return off("GEMMAJIT_TP_SYMMETRIC=0");
    if (!nccl) {
        try {  // loading the library needs no GPU
            nccl = &jit::Nccl::get(flags);
        } catch (const std::exception& e) {
            return off(fmt::format("no NCCL to plan them for ({})", e.what()));
        }
    }
    if (!nccl->has_device_api())
        return off(fmt::format(
            "NCCL {} at {} has no device API this engine knows (2.28.3, 2.28.7, 2.28.9)",
            nccl->version(), nccl->file()));
    std::string missing;
    const auto headers =
        jit::find_nccl_device_headers(flags, nccl->file(), nccl->version(), &missing);
    if (!headers) return off(missing + " (GEMMAJIT_NCCL_INCLUDE names the folder)");
    try {  // the CUDA headers found, utility.h in the form the compile patches
        jit::nccl_device_compile_inputs(*headers);
    } catch (const std::exception& e) {
        return off(e.what());
    }
    return FusedNormPlan{*headers, flags.get_bool("GEMMAJIT_TP_PUSH"),
                         int(flags.get_int("GEMMAJIT_TP_PREFILL_PUSH"))};
}

}  // namespace gj::gemma4
