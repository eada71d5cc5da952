#include "tools/http_server.h"

#include <httplib.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "engine/serve/api_error.h"
#include "engine/serve/openai_json.h"
#include "engine/serve/request.h"

namespace gj::tools {

namespace {

using Json = nlohmann::json;
using serve::ApiError;

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// Compares without an early exit, so the time taken does not tell how much of a key matched.
bool constant_time_equal(std::string_view a, std::string_view b) {
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    for (size_t i = 0; i < a.size(); ++i) {
        diff |= static_cast<unsigned char>(a[i] ^ (b.empty() ? 0 : b[i % b.size()]));
    }
    return diff == 0;
}

void send_json(httplib::Response& res, int status, const Json& j) {
    res.status = status;
    res.set_content(serve::dump_json(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
    send_json(res, e.status, e.to_json());
}

// Reads a POST body whatever its Content-Type says. A plain httplib handler gets a body sent as
// application/x-www-form-urlencoded (what `curl -d` sends without -H) parsed as a form and
// refused past 8 KB (CPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH) with a 413, whatever
// set_payload_max_length says; a content-reader handler gets the bytes as sent, and this caps
// them at `max_bytes` (httplib caps only bodies that announce a Content-Length).
std::string read_body(const httplib::Request& req, httplib::Response& res,
                      const httplib::ContentReader& reader, size_t max_bytes) {
    if (req.is_multipart_form_data()) {
        // Drained, so the connection stays in step for the next request on it.
        (void)reader([](const httplib::MultipartFormData&) { return true; },
                     [](const char*, size_t) { return true; });
        throw ApiError(400,
                       "the request body must be JSON (Content-Type: application/json), not "
                       "multipart/form-data");
    }
    std::string body;
    const bool chunked =
        req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos;
    // No body announced: an empty one, which parse_body then calls not JSON.
    if (!req.has_header("Content-Length") && !chunked) return body;
    bool too_large = false;
    const bool ok = reader([&](const char* data, size_t n) {
        too_large = body.size() + n > max_bytes;
        if (!too_large) body.append(data, n);
        return !too_large;
    });
    if (too_large || res.status == 413) {
        throw ApiError(413, "the request body is too large (the limit is " +
                                std::to_string(max_bytes) + " bytes)");
    }
    if (!ok) throw ApiError(400, "the request body could not be read");
    return body;
}

// The error a job that did not finish normally ends with (none for a normal finish). A job is
// cancelled with a live client only when the server shuts down: a client that left gets nothing.
std::optional<ApiError> job_error(const serve::JobEvent& done) {
    if (done.finish == serve::Finish::Cancelled) {
        return ApiError(503, "the request was cancelled: the server is shutting down", "", "",
                        "server_error");
    }
    if (done.finish == serve::Finish::Error) {
        return ApiError(500, "generation failed: " + done.error, "", "", "server_error");
    }
    return std::nullopt;
}

// The answer past the in-flight bound. Connection: close because an idle keep-alive connection
// holds a server thread (for httplib's keep-alive timeout), and the threads are what the bound
// keeps free; the client closes on seeing it (httplib does not look at a response's header).
void reject_busy(httplib::Response& res, int in_flight) {
    send_error(res, ApiError(503,
                             "server busy: " + std::to_string(in_flight) +
                                 " requests in flight; retry later",
                             "", "server_busy", "server_error"));
    res.set_header("Retry-After", "1");
    res.set_header("Connection", "close");
}

int in_flight_limit(const ServeConfig& c) {
    if (c.http_threads <= kFreeHttpThreads) {
        throw std::invalid_argument("the server needs more than " +
                                    std::to_string(kFreeHttpThreads) + " HTTP threads; got " +
                                    std::to_string(c.http_threads));
    }
    return c.http_threads - kFreeHttpThreads;
}
}  // namespace

HttpServer::HttpServer(ServeConfig config)
    : config_(std::move(config)),
      server_(std::make_unique<httplib::Server>()),
      in_flight_(in_flight_limit(config_)),
      started_(unix_now()) {
    routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
    int port = config_.port == 0
                   ? server_->bind_to_any_port(config_.host)
                   : (server_->bind_to_port(config_.host, config_.port) ? config_.port : -1);
    if (port < 0) {
        throw std::runtime_error("cannot listen on " + config_.host + ":" +
                                 std::to_string(config_.port) +
                                 " (in use, or not an address here)");
    }
    return port;
}

void HttpServer::listen() {
    server_->listen_after_bind();
}

void HttpServer::stop() {
    server_->stop();
}

void HttpServer::set_ready(std::shared_ptr<const gemma4::ModelFile> file,
                           serve::Scheduler* scheduler) {
    file_ = std::move(file);
    scheduler_ = scheduler;
    style_ = chat::ChatStyle::from_template(file_->tokenizer().vocab().chat_template);
    ready_.store(true, std::memory_order_release);
}

void HttpServer::routes() {
    httplib::Server& s = *server_;
    const int threads = config_.http_threads;
    s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    s.set_payload_max_length(config_.max_body_bytes);
    s.set_read_timeout(config_.read_timeout_s, 0);
    s.set_write_timeout(config_.write_timeout_s, 0);

    s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        ++requests_;
        if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
        if (!config_.api_key.empty()) {
            const std::string auth = req.get_header_value("Authorization");
            constexpr std::string_view bearer = "Bearer ";
            const bool ok =
                auth.size() > bearer.size() && auth.compare(0, bearer.size(), bearer) == 0 &&
                constant_time_equal(std::string_view(auth).substr(bearer.size()), config_.api_key);
            if (!ok) {
                ++errors_;
                send_error(
                    res, ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)", "",
                                  "invalid_api_key", "authentication_error"));
                return httplib::Server::HandlerResponse::Handled;
            }
        }
        if (!ready_.load(std::memory_order_acquire)) {
            send_error(res,
                       ApiError(503, "the model is loading", "", "model_loading", "server_error"));
            return httplib::Server::HandlerResponse::Handled;
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });
    s.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
        ++errors_;
        if (!res.body.empty()) return;  // an OpenAI error object is already there
        const std::string msg = res.status == 404   ? "no such endpoint"
                                : res.status == 413 ? "the request body is too large"
                                                    : "the request could not be handled";
        send_error(res, ApiError(res.status, msg, "", "", "invalid_request_error"));
    });
    s.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
            try {
                std::rethrow_exception(ep);
            } catch (const ApiError& e) {
                send_error(res, e);
            } catch (const std::exception& e) {
                send_error(res, ApiError(500, std::string("internal error: ") + e.what(), "", "",
                                         "server_error"));
            }
        });

    s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        if (ready_.load(std::memory_order_acquire)) {
            send_json(res, 200, {{"status", "ok"}});
        } else {
            send_json(res, 503, {{"status", "loading"}});
        }
    });
    s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
        send_json(res, 200,
                  {{"object", "list"},
                   {"data", Json::array({{{"id", config_.model_name},
                                          {"object", "model"},
                                          {"created", started_},
                                          {"owned_by", "gemmajit"}}})}});
    });
    // Every POST route reads its body through read_body (see there for why).
    const size_t max_body = config_.max_body_bytes;
    auto post = [&s, max_body](const std::string& pattern, auto handler) {
        s.Post(pattern, [handler, max_body](const httplib::Request& req, httplib::Response& res,
                                            const httplib::ContentReader& reader) {
            handler(serve::parse_body(read_body(req, res, reader, max_body)), res);
        });
    };
    post("/tokenize", [this](const Json& body, httplib::Response& res) {
        if (!body.contains("content") || !body["content"].is_string()) {
            throw ApiError(400, "'content' must be a string", "content");
        }
        bool add_special = false;
        if (auto it = body.find("add_special"); it != body.end() && !it->is_null()) {
            if (!it->is_boolean()) {
                throw ApiError(400, "'add_special' must be a boolean", "add_special");
            }
            add_special = it->get<bool>();
        }
        const auto ids = file_->tokenizer().encode(body["content"].get<std::string>(), add_special);
        send_json(res, 200, {{"tokens", ids}});
    });
    post("/detokenize", [this](const Json& body, httplib::Response& res) {
        if (!body.contains("tokens") || !body["tokens"].is_array()) {
            throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
        }
        std::vector<int32_t> ids;
        for (const Json& t : body["tokens"]) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
                t.get<int64_t>() >= file_->tokenizer().vocab_size()) {
                throw ApiError(400, "'tokens' holds an id outside the vocabulary", "tokens");
            }
            ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
        }
        send_json(res, 200, {{"content", file_->tokenizer().decode(ids)}});
    });
    s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        const serve::SchedulerStats st = scheduler_->stats();
        std::string m;
        auto metric = [&](const char* name, const char* type, const char* help, double v) {
            m += std::string("# HELP gemmajit_") + name + " " + help + "\n# TYPE gemmajit_" + name +
                 " " + type + "\ngemmajit_" + name + " " + std::to_string(v) + "\n";
        };
        metric("requests_total", "counter", "HTTP requests received",
               static_cast<double>(requests_.load()));
        metric("request_errors_total", "counter", "HTTP requests answered with an error",
               static_cast<double>(errors_.load()));
        metric("prompt_tokens_total", "counter", "prompt tokens prefilled",
               static_cast<double>(st.prompt_tokens));
        metric("generated_tokens_total", "counter", "tokens generated",
               static_cast<double>(st.generated_tokens));
        metric("generated_tokens_per_second", "gauge", "generated tokens per second of decoding",
               st.decode_seconds > 0 ? static_cast<double>(st.generated_tokens) / st.decode_seconds
                                     : 0.0);
        metric("requests_in_flight", "gauge",
               "generation requests running or queued (past the bound: 503 server busy)",
               in_flight_.in_flight());
        metric("queue_length", "gauge", "requests waiting for a slot", st.queued);
        metric("slots_busy", "gauge", "slots running a request", st.slots_busy);
        metric("slots", "gauge", "slots (--parallel)", st.slots);
        metric("kv_cache_tokens", "gauge", "positions held in the slots' KV caches",
               static_cast<double>(st.kv_tokens));
        metric("kv_cache_usage_ratio", "gauge", "KV cache positions held / capacity",
               st.kv_capacity > 0
                   ? static_cast<double>(st.kv_tokens) / static_cast<double>(st.kv_capacity)
                   : 0.0);
        res.set_content(m, "text/plain; version=0.0.4");
    });

    // The two generating endpoints share everything but the prompt and the JSON shapes.
    auto generate = [this](const Json& body, httplib::Response& res, bool chat_api) {
        // Held until the reply is written: the providers below keep it alive past this call.
        serve::InFlightLimit::Ticket ticket = in_flight_.try_acquire();
        if (!ticket) return reject_busy(res, in_flight_.limit());
        serve::GenJob g;
        serve::GenerationParams params;
        const tok::Tokenizer& tokenizer = file_->tokenizer();
        if (chat_api) {
            serve::ChatRequest cr = serve::parse_chat_request(body, config_.sampling);
            std::string rendered;
            try {
                rendered = chat::render(cr.messages, cr.options, style_);
            } catch (const chat::ChatError& e) {
                // parse_chat_request rendered it once already; the model's style changes no
                // check, but a render error is the request's all the same.
                throw ApiError(400, e.what(), "messages");
            }
            // The text starts <bos>. A forced tool call (tool_choice): the prompt ends with the
            // call's opening, whose marker spelling encodes as the marker token.
            g.prompt = tokenizer.encode(rendered + cr.reply_prefix, /*add_bos=*/false);
            g.parse_chat = true;
            g.tools = !cr.options.tools.empty();
            g.reply_prefix = std::move(cr.reply_prefix);
            params = std::move(cr.gen);
        } else {
            serve::CompletionRequest cr = serve::parse_completion_request(body, config_.sampling);
            g.prompt = tokenizer.encode(cr.prompt, /*add_bos=*/true);
            params = std::move(cr.gen);
        }
        g.sampling = params.sampling;
        g.max_tokens = params.max_tokens;
        g.stop = params.stop;
        serve::ResponseMeta meta{(chat_api ? "chatcmpl-" : "cmpl-") + std::to_string(started_) +
                                     "-" + std::to_string(++next_id_),
                                 unix_now(),
                                 params.model.empty() ? config_.model_name : params.model};
        // Everything up to here answers with its own status (400, 503, ...); from here on the
        // reply is a 200 written by a content provider.
        std::shared_ptr<serve::Job> job = scheduler_->submit(std::move(g));
        serve::Scheduler* sched = scheduler_;
        // The content providers must be copyable (std::function) and the ticket is not.
        auto held = std::make_shared<serve::InFlightLimit::Ticket>(std::move(ticket));

        if (!params.stream) {
            // A non-streamed reply is a chunked 200 too, so that the wait for the job notices a
            // client that went away: httplib 0.11 tells a handler nothing about its connection,
            // a provider's sink does. While the job runs the body gets a space about once a
            // second (whitespace before a JSON value is valid JSON, so every client parses the
            // body as before); it keeps proxies and read timeouts from taking an idle connection
            // for a dead one, and a space that cannot be written is a client that left. Then
            // the JSON. "; charset=utf-8" because httplib compresses exactly "application/json"
            // for a client that accepts gzip or br, and a compressor holds the spaces back.
            struct Pending {
                serve::ParsedDelta reply;
                bool finished = false;
                std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
            };
            auto p = std::make_shared<Pending>();
            res.set_chunked_content_provider(
                "application/json; charset=utf-8",
                [this, p, job, sched, meta, chat_api, held](size_t, httplib::DataSink& sink) {
                    for (serve::JobEvent& e : job->wait(std::chrono::milliseconds(100))) {
                        p->reply.append(std::move(e.delta));
                        if (!e.done) continue;
                        p->finished = true;
                        Json out;
                        if (std::optional<ApiError> err = job_error(e)) {
                            // The 200 header went out when the job was queued, so a job that
                            // fails or is cancelled (the server shutting down) can only say so
                            // in the body: an OpenAI error object, as a streamed reply sends.
                            ++errors_;
                            out = err->to_json();
                        } else {
                            out = chat_api
                                      ? serve::chat_completion(meta, p->reply, e.finish, e.usage)
                                      : serve::text_completion(meta, p->reply.content, e.finish,
                                                               e.usage);
                        }
                        const std::string body = serve::dump_json(out);
                        if (!sink.write(body.data(), body.size())) return false;
                        sink.done();
                        return true;
                    }
                    // is_writable peeks at the socket: a client that closed it is seen at once.
                    bool alive = sink.is_writable();
                    const auto now = std::chrono::steady_clock::now();
                    if (alive && now - p->last_write >= std::chrono::seconds(1)) {
                        p->last_write = now;
                        alive = sink.write(" ", 1);
                    }
                    if (!alive) sched->cancel(job);  // queued or running, it goes
                    return alive;
                },
                // Torn down before the job finished (a failed write, the server stopping): the
                // job must not run on for nobody.
                [p, job, sched](bool) {
                    if (!p->finished) sched->cancel(job);
                });
            return;
        }
        auto started = std::make_shared<bool>(false);
        auto tool_index = std::make_shared<int>(0);
        const bool include_usage = params.include_usage;
        res.set_chunked_content_provider(
            "text/event-stream",
            [=](size_t, httplib::DataSink& sink) {
                auto send = [&](const Json& j) {
                    const std::string s = serve::sse_data(j);
                    return sink.write(s.data(), s.size());
                };
                if (chat_api && !*started) {
                    *started = true;
                    if (!send(serve::chat_chunk(meta, {{"role", "assistant"}, {"content", ""}}))) {
                        sched->cancel(job);
                        return false;
                    }
                }
                const auto events = job->wait(std::chrono::milliseconds(100));
                if (events.empty() && !sink.is_writable()) {  // the client went away
                    sched->cancel(job);
                    return false;
                }
                for (const serve::JobEvent& e : events) {
                    bool ok = true;
                    if (chat_api) {
                        for (const Json& d : serve::chat_deltas(meta, e.delta, *tool_index)) {
                            ok = ok && send(serve::chat_chunk(meta, d));
                        }
                    } else if (!e.delta.content.empty()) {
                        ok = send(serve::text_completion_chunk(meta, e.delta.content));
                    }
                    if (ok && e.done) {
                        if (std::optional<ApiError> err = job_error(e)) {
                            ok = send(err->to_json());
                        } else {
                            const char* why = serve::finish_reason_name(e.finish);
                            ok = send(chat_api ? serve::chat_chunk(meta, Json::object(), why)
                                               : serve::text_completion_chunk(meta, "", why));
                            if (ok && include_usage) {
                                Json u = serve::chat_usage_chunk(meta, e.usage);
                                if (!chat_api) u["object"] = "text_completion";
                                ok = send(u);
                            }
                        }
                        ok = ok && sink.write(serve::kSseDone, std::strlen(serve::kSseDone));
                        if (ok) sink.done();
                        return ok;
                    }
                    if (!ok) {
                        sched->cancel(job);
                        return false;
                    }
                }
                return true;
            },
            // `held`, the in-flight ticket, goes with the response.
            [job, sched, held](bool success) {
                if (!success) sched->cancel(job);
            });
    };
    post("/v1/chat/completions",
         [generate](const Json& body, httplib::Response& res) { generate(body, res, true); });
    post("/v1/completions",
         [generate](const Json& body, httplib::Response& res) { generate(body, res, false); });
}

}  // namespace gj::tools
