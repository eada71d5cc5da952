// The HTTP binding of `gemmajit serve` (cpp-httplib): routes, the API key check, SSE streaming
// through httplib's chunked content provider, and Prometheus metrics. Everything that is not
// HTTP (request parsing, response JSON, the slot scheduler) lives in engine/serve/.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "engine/model/model_file.h"
#include "engine/serve/in_flight.h"
#include "engine/serve/scheduler.h"
#include "engine/text/chat_format.h"
#include "engine/text/sampler.h"

namespace httplib {
class Server;
}

namespace gj::tools {

struct ServeConfig {
    std::string host = "127.0.0.1";
    int port = 8080;  // 0: any free port
    std::string api_key;
    std::string model_name;  // what /v1/models lists and responses echo
    sample::SamplerParams sampling;
    size_t max_body_bytes = 8u << 20;
    int read_timeout_s = 30, write_timeout_s = 30;
    // Concurrent connections: each open one holds a thread, a generation request until its
    // reply is written. At most http_threads - kFreeHttpThreads generation requests are in flight
    // (running or queued); more are answered 503 at once, so the cheap endpoints always find a
    // thread.
    int http_threads = 32;
};

// Threads that waiting generation requests never take (see ServeConfig::http_threads).
inline constexpr int kFreeHttpThreads = 4;
// --http-threads 0: room for every slot plus a queue three times as long, and never fewer than
// the 32 threads the server always had.
inline int default_http_threads(int parallel) {
    return parallel * 4 + 8 > 32 ? parallel * 4 + 8 : 32;
}

class HttpServer {
  public:
    explicit HttpServer(ServeConfig config);
    ~HttpServer();
    // Binds the socket; returns the port (the chosen one for port 0). Throws when it cannot.
    int bind();
    void listen();  // serves until stop(); call from its own thread
    // The model is loaded: /health turns 200 and the API answers. Both must outlive the server.
    void set_ready(std::shared_ptr<const gemma4::ModelFile> file, serve::Scheduler* scheduler);
    void stop();

  private:
    void routes();
    ServeConfig config_;
    std::unique_ptr<httplib::Server> server_;
    serve::InFlightLimit in_flight_;  // generation requests (see ServeConfig::http_threads)
    std::shared_ptr<const gemma4::ModelFile> file_;
    serve::Scheduler* scheduler_ = nullptr;
    chat::ChatStyle style_;
    std::atomic<bool> ready_{false};
    std::atomic<uint64_t> requests_{0}, errors_{0}, next_id_{0};
    int64_t started_ = 0;
};

}  // namespace gj::tools
