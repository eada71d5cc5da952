// The one error type of the server's request handling: an OpenAI-style error object
// ({"error": {"message", "type", "param", "code"}}) with the HTTP status it goes out with. Every
// problem a request can have is thrown as one, so the HTTP layer has a single catch that turns it
// into a response, and nothing a client sends can escape as another exception.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace gj::serve {

struct ApiError : std::runtime_error {
    int status;         // HTTP status: 400, 401, 404, 413, 503, ...
    std::string type;   // "invalid_request_error", "authentication_error", "server_error", ...
    std::string param;  // the request field at fault, or ""
    std::string code;   // a short machine-readable reason, or ""

    ApiError(int status_, std::string message, std::string param_ = "", std::string code_ = "",
             std::string type_ = "invalid_request_error")
        : std::runtime_error(std::move(message)),
          status(status_),
          type(std::move(type_)),
          param(std::move(param_)),
          code(std::move(code_)) {}

    // The response body; param and code are null when empty, as OpenAI sends them.
    nlohmann::json to_json() const {
        nlohmann::json e = {{"message", what()}, {"type", type}};
        e["param"] = param.empty() ? nlohmann::json() : nlohmann::json(param);
        e["code"] = code.empty() ? nlohmann::json() : nlohmann::json(code);
        return {{"error", e}};
    }
};

}  // namespace gj::serve
