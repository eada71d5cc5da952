// The NVRTC identity's record in the cache root: written by the first process that probes, read
// by the next instead of probing, ignored (and replaced) when it no longer describes the loaded
// library, never written into a read-only cache. The identity is fixed once per process, so each
// case runs in a forked child that reports the identity it got.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "cache/store.h"
#include "jit/nvrtc_compiler.h"
#include "tests/support/test_env.h"

using namespace gj::jit;
namespace fs = std::filesystem;

namespace {

// The identity a fresh process gets from nvrtc_identity(root, write), as "build|build_id".
std::string identity_in_child(const fs::path& root, bool write) {
    int out[2];
    if (::pipe(out) != 0) return "pipe failed";
    pid_t pid = ::fork();
    if (pid == 0) {
        ::close(out[0]);
        const NvrtcIdentity& id = nvrtc_identity(root, write);
        std::string text = id.build + "|" + id.build_id;
        (void)!::write(out[1], text.data(), text.size());
        ::_exit(0);
    }
    ::close(out[1]);
    std::string text;
    char buf[256];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, n);
    ::close(out[0]);
    ::waitpid(pid, nullptr, 0);
    return text;
}

std::vector<fs::path> records(const fs::path& root) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root / "nvrtc-identity", ec))
        if (e.path().extension() == ".json") out.push_back(e.path());
    return out;
}

nlohmann::json read_json(const fs::path& file) {
    return nlohmann::json::parse(*gj::cache::read_file(file));
}

void write_json(const fs::path& file, const nlohmann::json& j) {
    std::ofstream(file) << j.dump(2);
}

}  // namespace

TEST(NvrtcIdentityRecord, WrittenOnceThenReadInsteadOfProbed) {
    gj::test::ScratchDir tmp("identity");
    const std::string probed = identity_in_child(tmp.path(), true);
    ASSERT_NE(probed.find('|'), std::string::npos) << probed;
    auto files = records(tmp.path());
    ASSERT_EQ(files.size(), 1u);
    nlohmann::json record = read_json(files[0]);
    EXPECT_EQ(record["build"].get<std::string>() + "|" + record["build_id"].get<std::string>(),
              probed);
    EXPECT_FALSE(record["supported_archs"].empty());

    // A record that still describes the library is believed (this one says so with a marker).
    record["build_id"] = "CL-from-the-record";
    write_json(files[0], record);
    EXPECT_EQ(identity_in_child(tmp.path(), true),
              record["build"].get<std::string>() + "|CL-from-the-record");

    // One that describes another file (size, mtime or inode differ) is probed over and replaced.
    record["size"] = record["size"].get<uint64_t>() + 1;
    write_json(files[0], record);
    EXPECT_EQ(identity_in_child(tmp.path(), true), probed);
    EXPECT_EQ(read_json(files[0])["build_id"].get<std::string>(),
              probed.substr(probed.find('|') + 1));

    // Garbage is not an identity.
    std::ofstream(files[0]) << "{ not json";
    EXPECT_EQ(identity_in_child(tmp.path(), true), probed);
}

TEST(NvrtcIdentityRecord, ReadOnlyCacheIsNotWritten) {
    gj::test::ScratchDir tmp("identity-ro");
    const std::string probed = identity_in_child(tmp.path(), false);
    EXPECT_NE(probed.find('|'), std::string::npos) << probed;
    EXPECT_TRUE(records(tmp.path()).empty());
    EXPECT_FALSE(fs::exists(tmp.path() / "nvrtc-identity"));
}
