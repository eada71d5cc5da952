// Removal of the writer's temporary files when the process is killed by a signal. A GGUF being
// written is a "<path>.partial-XXXXXX" until it is complete (writer.h); an interrupted `quantize`
// or `synth` (Ctrl-C, SIGTERM, a closed terminal) would otherwise leave that temporary behind,
// as large as the model, for the user to find and delete.
#pragma once

namespace gj::gguf {

// Registers `path` for removal should the process die of SIGINT, SIGTERM or SIGHUP before it is
// unregistered. On the first registration, a handler is installed for each of those signals whose
// disposition is still the default (one a program set itself, or an ignored one, is kept); the
// handler removes every registered path, restores the default and raises the signal again, so
// the process still ends as the signal says. Returns the registration, or -1 when it could not be
// made (too many at once, or a path longer than PATH_MAX): the file is then not removed on a
// signal, as before. Thread-safe and async-signal-safe in the handler.
int register_partial_file(const char* path) noexcept;
// Ends a registration (-1: none) once the file was renamed or removed.
void unregister_partial_file(int registration) noexcept;

}  // namespace gj::gguf
