// The on-disk store alone (no CUDA): publish/load, corruption handling, modes, races, LRU pruning,
// and the per-entry lock files (entry_lock.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "cache/sha256.h"
#include "cache/store.h"
#include "tests/support/test_env.h"

using namespace gj::cache;
namespace fs = std::filesystem;

namespace {

struct Warnings {
    std::vector<std::string> lines;
    WarningSink sink() {
        return [this](const std::string& m) { lines.push_back(m); };
    }
};

EntryId make_id(const std::string& name, const std::string& payload_tag = "") {
    EntryId id;
    id.abi = 1;
    id.arch = "sm_90";
    id.compiler = "nvrtc-13.0.88";
    id.family = "fam";
    id.name = name;
    id.key = sha256_hex(name + payload_tag);
    return id;
}

Entry make_entry(const std::string& content, size_t cubin_bytes = 64) {
    Entry e;
    e.files = {{"kernel.cu", content}, {"kernel.cubin", std::string(cubin_bytes, 'c')}};
    e.meta = {{"note", "test"}};
    return e;
}

void set_last_used(const fs::path& dir, int64_t t) {
    auto text = read_file(dir / "meta.json");
    auto meta = nlohmann::json::parse(*text);
    meta["last_used"] = t;
    std::ofstream(dir / "meta.json") << meta.dump();
}

}  // namespace

TEST(CacheStore, PublishThenLoadRoundTrips) {
    gj::test::ScratchDir tmp("store");
    Store store({tmp.path(), Mode::ReadWrite, 0, nullptr});
    EntryId id = make_id("k.a");
    EXPECT_EQ(store.probe(id), Lookup::Missing);
    EXPECT_FALSE(store.load(id));
    auto dir = store.publish(id, make_entry("src"));
    ASSERT_TRUE(dir);
    EXPECT_EQ(*dir, tmp.path() / "v1" / "sm_90" / "nvrtc-13.0.88" / "fam" /
                        ("k.a-" + id.key.substr(0, 16)));
    EXPECT_EQ(store.probe(id), Lookup::Hit);
    auto e = store.load(id);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->files.at("kernel.cu"), "src");
    EXPECT_EQ(e->files.at("kernel.cubin").size(), 64u);
    EXPECT_EQ(e->meta["note"], "test");
    EXPECT_EQ(e->meta["key"], id.key);
    EXPECT_EQ(e->meta["payload"]["kernel.cu"]["sha256"], sha256_hex("src"));
    EXPECT_TRUE(e->meta.contains("created"));
    EXPECT_TRUE(e->meta.contains("last_used"));
    // No temp dirs are left behind.
    for (const auto& f : fs::directory_iterator(dir->parent_path()))
        EXPECT_FALSE(f.path().filename().string().starts_with(".")) << f.path();
}

TEST(CacheStore, AbiArchAndCompilerPartitionThePath) {
    EntryId a = make_id("k");
    EntryId b = a;
    b.abi = 2;
    EntryId c = a;
    c.arch = "sm_90a";
    EntryId d = a;
    d.compiler = "nvrtc-13.1.10";
    EXPECT_EQ(a.relative_dir().begin()->string(), "v1");
    EXPECT_EQ(b.relative_dir().begin()->string(), "v2");
    EXPECT_NE(a.relative_dir(), c.relative_dir());
    EXPECT_NE(a.relative_dir(), d.relative_dir());
    EXPECT_NE(c.relative_dir().string().find("/sm_90a/"), std::string::npos);
}

namespace {
// Damages one file of a published entry and checks load() detects it, deletes it with exactly
// one warning, and that a new publish restores a valid entry.
void expect_damage_is_repaired(const std::function<void(const fs::path&)>& damage,
                               const std::string& expected_problem) {
    gj::test::ScratchDir tmp("damage");
    Warnings w;
    Store store({tmp.path(), Mode::ReadWrite, 0, w.sink()});
    EntryId id = make_id("k.d");
    auto dir = store.publish(id, make_entry("the source", 4096));
    ASSERT_TRUE(dir);
    damage(*dir);
    EXPECT_EQ(store.probe(id), Lookup::Damaged);
    EXPECT_FALSE(store.load(id));
    ASSERT_EQ(w.lines.size(), 1u);
    EXPECT_NE(w.lines[0].find(expected_problem), std::string::npos) << w.lines[0];
    EXPECT_NE(w.lines[0].find("deleting"), std::string::npos) << w.lines[0];
    EXPECT_FALSE(fs::exists(*dir));
    ASSERT_TRUE(store.publish(id, make_entry("the source", 4096)));
    EXPECT_TRUE(store.load(id));
    EXPECT_EQ(w.lines.size(), 1u);
}
}  // namespace

TEST(CacheStore, TruncatedPayloadIsDeletedAndRebuilt) {
    expect_damage_is_repaired([](const fs::path& d) { fs::resize_file(d / "kernel.cubin", 100); },
                              "truncated");
}

TEST(CacheStore, BitFlippedPayloadIsDeletedAndRebuilt) {
    expect_damage_is_repaired(
        [](const fs::path& d) {
            std::fstream f(d / "kernel.cubin", std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(1000);
            f.put('c' ^ 0x10);
        },
        "sha256");
}

TEST(CacheStore, MissingPayloadFileIsDeletedAndRebuilt) {
    expect_damage_is_repaired([](const fs::path& d) { fs::remove(d / "kernel.cu"); }, "missing");
}

// A payload replaced by a FIFO: its open would wait for a writer and its reads never end, so a
// load hung. Now it is not a regular file: the entry is damaged and loads nothing. (Its folder,
// holding something the store never writes, is left where it is: upkeep deletes only what the
// store wrote.) In a child with an alarm, so that a regression fails instead of hanging the suite.
TEST(CacheStore, APayloadThatIsNoRegularFileIsDamagedNotWaitedOn) {
    gj::test::ScratchDir tmp("fifo");
    const int status = gj::test::run_in_child([&] {
        ::alarm(30);
        Warnings w;
        Store store({tmp.path(), Mode::ReadWrite, 0, w.sink()});
        const EntryId id = make_id("k.fifo");
        const auto dir = store.publish(id, make_entry("the source", 4096));
        if (!dir) return 2;
        fs::remove(*dir / "kernel.cubin");
        if (::mkfifo((*dir / "kernel.cubin").c_str(), 0644) != 0) return 3;
        if (store.probe(id) != Lookup::Damaged) return 4;
        if (store.load(id)) return 5;
        if (w.lines.empty() || w.lines[0].find("not a regular file") == std::string::npos) return 6;
        return 0;
    });
    EXPECT_EQ(status, 0) << "2: no publish, 3: no FIFO, 4: not damaged, 5: it loaded, 6: the "
                            "warning does not say why; >= 128: killed (142: the load hung)";
}

TEST(CacheStore, GarbledMetaIsDeletedAndRebuilt) {
    expect_damage_is_repaired([](const fs::path& d) { std::ofstream(d / "meta.json") << "{\"ke"; },
                              "meta.json");
}

TEST(CacheStore, ReadOnlyModeReadsButNeverWrites) {
    gj::test::ScratchDir tmp("ro");
    EntryId id = make_id("k.ro");
    {
        Store rw({tmp.path(), Mode::ReadWrite, 0, nullptr});
        ASSERT_TRUE(rw.publish(id, make_entry("x")));
    }
    Warnings w;
    Store ro({tmp.path(), Mode::ReadOnly, 0, w.sink()});
    EXPECT_TRUE(ro.load(id));
    EntryId other = make_id("k.other");
    EXPECT_FALSE(ro.publish(other, make_entry("y")));
    EXPECT_FALSE(fs::exists(ro.entry_dir(other)));
    // A damaged entry is reported but left alone in read-only mode.
    fs::resize_file(ro.entry_dir(id) / "kernel.cubin", 1);
    EXPECT_FALSE(ro.load(id));
    EXPECT_TRUE(fs::exists(ro.entry_dir(id)));
    EXPECT_EQ(w.lines.size(), 1u);
}

TEST(CacheStore, OffModeDoesNothing) {
    gj::test::ScratchDir tmp("off");
    Store off({tmp.path() / "c", Mode::Off, 0, nullptr});
    EntryId id = make_id("k");
    EXPECT_FALSE(off.publish(id, make_entry("x")));
    EXPECT_FALSE(off.load(id));
    EXPECT_FALSE(fs::exists(tmp.path() / "c"));
}

TEST(CacheStore, UnwritableRootWarnsOnceAndKeepsGoing) {
    gj::test::ScratchDir tmp("unwritable");
    std::ofstream(tmp.path() / "a_file") << "x";  // a root below a file can never be created
    Warnings w;
    Store store({tmp.path() / "a_file" / "cache", Mode::ReadWrite, 0, w.sink()});
    EXPECT_FALSE(store.publish(make_id("k1"), make_entry("x")));
    EXPECT_FALSE(store.publish(make_id("k2"), make_entry("y")));
    EXPECT_FALSE(store.load(make_id("k1")));
    ASSERT_EQ(w.lines.size(), 1u);
    EXPECT_NE(w.lines[0].find("not writable"), std::string::npos) << w.lines[0];
    EXPECT_NE(w.lines[0].find("in memory"), std::string::npos) << w.lines[0];
}

TEST(CacheStore, PermissionDeniedRootWarnsOnce) {
    if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
    gj::test::ScratchDir tmp("perm");
    fs::create_directories(tmp.path() / "c");
    fs::permissions(tmp.path() / "c", fs::perms::owner_read | fs::perms::owner_exec);
    Warnings w;
    Store store({tmp.path() / "c", Mode::ReadWrite, 0, w.sink()});
    EXPECT_FALSE(store.publish(make_id("k1"), make_entry("x")));
    EXPECT_FALSE(store.publish(make_id("k2"), make_entry("x")));
    EXPECT_EQ(w.lines.size(), 1u);
}

TEST(CacheStore, ConcurrentPublishersInOneProcessEndWithOneEntry) {
    gj::test::ScratchDir tmp("threads");
    Store store({tmp.path(), Mode::ReadWrite, 0, nullptr});
    EntryId id = make_id("k.race");
    std::vector<std::thread> threads;
    std::vector<std::optional<fs::path>> dirs(8);
    for (int t = 0; t < 8; ++t)
        threads.emplace_back([&, t] { dirs[t] = store.publish(id, make_entry("same", 20000)); });
    for (auto& t : threads) t.join();
    for (const auto& d : dirs) {
        ASSERT_TRUE(d);
        EXPECT_EQ(*d, store.entry_dir(id));
    }
    EXPECT_EQ(store.stat().entries, 1u);
    size_t leftovers = 0;
    for (const auto& f : fs::directory_iterator(store.entry_dir(id).parent_path()))
        leftovers += f.path().filename().string().starts_with(".");
    EXPECT_EQ(leftovers, 0u);
}

TEST(CacheStore, ConcurrentProcessesOnAnEmptyCacheEndWithOneValidEntry) {
    gj::test::ScratchDir tmp("procs");
    fs::path root = tmp.path() / "fresh";
    EntryId id = make_id("k.procs");
    int go[2];
    ASSERT_EQ(::pipe(go), 0);
    std::vector<pid_t> kids;
    for (int i = 0; i < 4; ++i) {
        pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            ::close(go[1]);
            char c;
            (void)!::read(go[0], &c, 1);  // all children start together
            Store store({root, Mode::ReadWrite, 0, nullptr});
            auto dir = store.publish(id, make_entry("same", 1 << 20));
            bool ok = dir && store.load(id).has_value();
            ::_exit(ok ? 0 : 1);
        }
        kids.push_back(pid);
    }
    ::close(go[0]);
    ::close(go[1]);  // EOF releases every child at once
    for (pid_t pid : kids) {
        int status = 0;
        ::waitpid(pid, &status, 0);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    Store store({root, Mode::ReadWrite, 0, nullptr});
    EXPECT_EQ(store.probe(id), Lookup::Hit);
    EXPECT_EQ(store.stat().entries, 1u);
    EXPECT_TRUE(store.verify(false).empty());
}

TEST(CacheStore, PruneRemovesLeastRecentlyUsedUntilUnderTheCap) {
    gj::test::ScratchDir tmp("prune");
    Store store({tmp.path(), Mode::ReadWrite, 0, nullptr});
    std::vector<EntryId> ids;
    for (int i = 0; i < 5; ++i) {
        ids.push_back(make_id(fmt::format("k{}", i)));
        auto dir = store.publish(ids.back(), make_entry("s", 10000));
        ASSERT_TRUE(dir);
        // k2 is the most recently used, k0 the least; the others in between.
        int64_t age[] = {5000, 4000, 10, 3000, 2000};
        set_last_used(*dir, 1'700'000'000 - age[i]);
    }
    uint64_t one = store.list().front().bytes;
    PruneResult r = store.prune(one * 3 + one / 2);
    EXPECT_EQ(r.removed, 2u);
    EXPECT_LE(r.remaining_bytes, one * 3 + one / 2);
    EXPECT_EQ(store.probe(ids[0]), Lookup::Missing);
    EXPECT_EQ(store.probe(ids[1]), Lookup::Missing);
    EXPECT_EQ(store.probe(ids[2]), Lookup::Hit);
    EXPECT_EQ(store.probe(ids[3]), Lookup::Hit);
    EXPECT_EQ(store.probe(ids[4]), Lookup::Hit);
    EXPECT_EQ(store.prune(0).removed, 0u);  // no cap: nothing valid goes
}

TEST(CacheStore, LoadRefreshesAStaleLastUsedStampOnlyHourly) {
    gj::test::ScratchDir tmp("touch");
    Store store({tmp.path(), Mode::ReadWrite, 0, nullptr});
    EntryId id = make_id("k.t");
    auto dir = store.publish(id, make_entry("s"));
    ASSERT_TRUE(dir);
    int64_t fresh = store.load(id)->meta["last_used"].get<int64_t>();
    set_last_used(*dir, fresh - 60);  // a minute ago: left alone
    store.load(id);
    EXPECT_EQ(store.list().front().last_used, fresh - 60);
    set_last_used(*dir, fresh - 7200);  // two hours ago: refreshed
    store.load(id);
    EXPECT_GE(store.list().front().last_used, fresh);
    EXPECT_EQ(store.probe(id), Lookup::Hit);
}

TEST(CacheStore, StatVerifyClear) {
    gj::test::ScratchDir tmp("stat");
    Store store({tmp.path(), Mode::ReadWrite, 0, nullptr});
    ASSERT_TRUE(store.publish(make_id("a"), make_entry("s")));
    ASSERT_TRUE(store.publish(make_id("b"), make_entry("s")));
    auto st = store.stat();
    EXPECT_EQ(st.entries, 2u);
    EXPECT_GT(st.bytes, 128u);
    EXPECT_EQ(st.entries_per_partition.at("v1/sm_90/nvrtc-13.0.88"), 2u);
    fs::resize_file(store.entry_dir(make_id("b")) / "kernel.cubin", 3);
    auto bad = store.verify(true);
    ASSERT_EQ(bad.size(), 1u);
    EXPECT_NE(bad[0].problem.find("truncated"), std::string::npos);
    EXPECT_EQ(store.stat().entries, 1u);
    EXPECT_EQ(store.clear(), 1u);
    EXPECT_EQ(store.stat().entries, 0u);
    EXPECT_FALSE(fs::exists(tmp.path() / "v1"));
}

TEST(EntryLock, SecondAcquirerIsBusyUntilTheHolderReleases) {
    gj::test::ScratchDir tmp("lock");
    fs::path path = tmp.path() / "k.lock";
    EntryLock a = EntryLock::acquire(path, std::chrono::milliseconds(0));
    ASSERT_TRUE(a.held());
    EXPECT_EQ(EntryLock::acquire(path, std::chrono::milliseconds(0)).state(),
              EntryLock::State::Busy);
    EntryLock b = EntryLock::acquire(path, std::chrono::milliseconds(60));
    EXPECT_EQ(b.state(), EntryLock::State::Busy);
    EXPECT_GE(b.waited().count(), 60);
    a.release();
    EXPECT_FALSE(fs::exists(path)) << "the holder removes its lock file";
    EntryLock c = EntryLock::acquire(path, std::chrono::milliseconds(0));
    EXPECT_TRUE(c.held());
    EXPECT_EQ(c.waited().count(), 0);
}

TEST(EntryLock, AWaiterGetsTheLockWhenTheHolderReleases) {
    gj::test::ScratchDir tmp("lockwait");
    fs::path path = tmp.path() / "k.lock";
    EntryLock a = EntryLock::acquire(path, std::chrono::milliseconds(0));
    ASSERT_TRUE(a.held());
    EntryLock b;
    std::thread waiter([&] { b = EntryLock::acquire(path, std::chrono::seconds(30)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    a.release();  // unlinks the file the waiter has open: it must notice and start over
    waiter.join();
    EXPECT_TRUE(b.held());
    EXPECT_GE(b.waited().count(), 90);
    EXPECT_TRUE(fs::exists(path));
    // Exactly one holder: a third party is refused.
    EXPECT_EQ(EntryLock::acquire(path, std::chrono::milliseconds(0)).state(),
              EntryLock::State::Busy);
}

TEST(EntryLock, AKilledHoldersLockIsTakenOver) {
    gj::test::ScratchDir tmp("lockdead");
    fs::path path = tmp.path() / "k.lock";
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        EntryLock held = EntryLock::acquire(path, std::chrono::milliseconds(0));
        ::kill(::getpid(), held.held() ? SIGKILL : SIGTERM);  // dies holding it
        ::_exit(1);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    EXPECT_TRUE(fs::exists(path)) << "a killed holder leaves its file";
    EXPECT_TRUE(EntryLock::acquire(path, std::chrono::milliseconds(0)).held());
}

TEST(CacheStore, LockFilesAreNeverEntriesAndPruneRemovesOnlyUnheldOnes) {
    gj::test::ScratchDir tmp("locks");
    Store store({tmp.path(), Mode::ReadWrite, 0, nullptr});
    EntryId id = make_id("k.entry");
    ASSERT_TRUE(store.publish(id, make_entry("x")));
    EXPECT_EQ(store.lock_path(id),
              store.entry_dir(id).parent_path() / ("k.entry-" + id.key.substr(0, 16) + ".lock"));
    EntryLock held = store.lock(make_id("k.busy"), std::chrono::milliseconds(0));
    ASSERT_TRUE(held.held());
    // A lock file its holder left behind when it was killed.
    std::ofstream(store.lock_path(make_id("k.dead"))) << "";
    EXPECT_EQ(store.stat().entries, 1u);
    EXPECT_EQ(store.list(true).size(), 1u);
    EXPECT_TRUE(store.verify(false).empty());
    PruneResult r = store.prune(0);
    EXPECT_EQ(r.removed, 0u);
    EXPECT_FALSE(fs::exists(store.lock_path(make_id("k.dead"))));
    EXPECT_TRUE(fs::exists(store.lock_path(make_id("k.busy"))));
    EXPECT_EQ(store.probe(id), Lookup::Hit);
}

TEST(CacheStore, LockIsUnavailableWhereNothingMayBeWritten) {
    gj::test::ScratchDir tmp("lockmodes");
    EntryId id = make_id("k");
    Store ro({tmp.path() / "ro", Mode::ReadOnly, 0, nullptr});
    EXPECT_EQ(ro.lock(id, std::chrono::seconds(10)).state(), EntryLock::State::Unavailable);
    Store off({tmp.path() / "off", Mode::Off, 0, nullptr});
    EXPECT_EQ(off.lock(id, std::chrono::seconds(10)).state(), EntryLock::State::Unavailable);
    EXPECT_FALSE(fs::exists(tmp.path() / "ro"));
    EXPECT_FALSE(fs::exists(tmp.path() / "off"));
    // An unwritable root: no lock and no warning of its own; publish gives the one warning.
    std::ofstream(tmp.path() / "a_file") << "x";
    Warnings w;
    Store bad({tmp.path() / "a_file" / "cache", Mode::ReadWrite, 0, w.sink()});
    EXPECT_EQ(bad.lock(id, std::chrono::seconds(10)).state(), EntryLock::State::Unavailable);
    EXPECT_FALSE(bad.publish(id, make_entry("x")));
    EXPECT_EQ(bad.lock(id, std::chrono::seconds(10)).state(), EntryLock::State::Unavailable);
    EXPECT_EQ(w.lines.size(), 1u);
}

namespace {
void write_text(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
}
}  // namespace

TEST(CacheStore, EntryNamesAreTheOnesTheStoreWrites) {
    EXPECT_TRUE(is_entry_name("k.a-0123456789abcdef"));
    EXPECT_TRUE(is_entry_name("matvec_q4_0.k10752.split-0123456789abcdef"));
    EXPECT_TRUE(is_entry_name("a-b-0123456789abcdef"));
    EXPECT_FALSE(is_entry_name("beach"));
    EXPECT_FALSE(is_entry_name("-0123456789abcdef"));        // no name
    EXPECT_FALSE(is_entry_name(".k-0123456789abcdef"));      // hidden
    EXPECT_FALSE(is_entry_name("k-0123456789ABCDEF"));       // upper case
    EXPECT_FALSE(is_entry_name("k-0123456789abcde"));        // 15 hex
    EXPECT_FALSE(is_entry_name("k_0123456789abcdef"));       // no dash
    EXPECT_FALSE(is_entry_name("k x-0123456789abcdef"));     // a space
    EXPECT_FALSE(is_entry_name("k-0123456789abcdef.lock"));  // a lock file
    // Publishing an id upkeep would not recognize is refused rather than left unprunable.
    gj::test::ScratchDir tmp("badid");
    Store store({tmp.path(), Mode::ReadWrite, 0, nullptr});
    EntryId id = make_id("k");
    id.name = ".hidden";
    EXPECT_THROW(store.publish(id, make_entry("x")), std::invalid_argument);
    id = make_id("k");
    id.key = "ABCDEF0123456789ABCDEF";
    EXPECT_THROW(store.publish(id, make_entry("x")), std::invalid_argument);
    EXPECT_FALSE(store.load(id));
    EXPECT_EQ(store.probe(id), Lookup::Missing);
}

// Files and folders under the root that the store did not write survive stat, verify, prune and
// clear: folders five levels down, lock-like files, entry-named folders holding a folder, work
// folder look-alikes, and whatever a link to a folder leads to.
TEST(CacheStore, UpkeepNeverDeletesWhatTheStoreDidNotWrite) {
    gj::test::ScratchDir tmp("foreign");
    const fs::path root = tmp.path() / "root";
    const fs::path outside = tmp.path() / "outside";
    const std::vector<fs::path> foreign = {
        root / "v2/photos/2023/summer/beach/img.jpg",
        root / "v2/docs/a/b/notes.lock",
        root / "v1/sm_90/nvrtc-13.0.88/fam/holiday/pic.jpg",
        root / "v1/sm_90/nvrtc-13.0.88/fam/k.nested-0123456789abcdef/sub/file.txt",
        root / "v1/sm_90/nvrtc-13.0.88/fam/k.nested-0123456789abcdef/meta.json",
        root / "v1/sm_90/nvrtc-13.0.88/fam/.trash-mine/keep.txt",
        root / "v1/sm_90/nvrtc-13.0.88/fam/.tmp-k-0123456789abcdef-12-0123456789ab/sub/x",
        root / "v1/sm_90/nvrtc-13.0.88/fam/k.full-0123456789abcdef.lock",  // not empty
        root / "v1/sm_90/nvrtc-13.0.88/fam/readme.txt",
        root / "notes.txt",
        outside / "sm_90/nvrtc/fam/k.out-0123456789abcdef/meta.json",
        outside / "sm_90/nvrtc/fam/k.out-0123456789abcdef/kernel.cubin",
    };
    for (const auto& f : foreign) write_text(f, "mine");
    fs::create_directories(root / "v1/sm_90/nvrtc-13.0.88/fam/empty-folder");
    fs::create_directory_symlink(outside, root / "v3");  // a link is never walked into

    Warnings w;
    Store store({root, Mode::ReadWrite, 0, w.sink()});
    EntryId good = make_id("k.good"), bad = make_id("k.bad");
    ASSERT_TRUE(store.publish(good, make_entry("s")));
    ASSERT_TRUE(store.publish(bad, make_entry("s")));
    fs::resize_file(store.entry_dir(bad) / "kernel.cubin", 1);
    EXPECT_TRUE(fs::exists(root / kCacheDirTag));

    EXPECT_EQ(store.list().size(), 2u);
    EXPECT_EQ(store.stat().entries, 1u);
    auto damaged = store.verify(true);
    ASSERT_EQ(damaged.size(), 1u);
    EXPECT_EQ(damaged[0].dir, store.entry_dir(bad));
    EXPECT_EQ(store.prune(0).removed, 0u);
    EXPECT_EQ(store.prune(1).removed, 1u);  // the valid entry, over the cap
    ASSERT_TRUE(store.publish(good, make_entry("s")));
    EXPECT_EQ(store.clear(), 1u);
    EXPECT_EQ(store.list().size(), 0u);
    for (const auto& f : foreign) EXPECT_TRUE(fs::exists(f)) << f;
    EXPECT_TRUE(fs::exists(root / "v1/sm_90/nvrtc-13.0.88/fam/empty-folder"));
    EXPECT_TRUE(fs::exists(root / kCacheDirTag));
    EXPECT_FALSE(fs::exists(store.entry_dir(good)));
}

// A damaged entry the store would repair, but which holds a folder, is reported and left alone.
TEST(CacheStore, AnEntryHoldingAFolderIsNeverDeleted) {
    gj::test::ScratchDir tmp("nested");
    Warnings w;
    Store store({tmp.path(), Mode::ReadWrite, 0, w.sink()});
    EntryId id = make_id("k.n");
    auto dir = store.publish(id, make_entry("s"));
    ASSERT_TRUE(dir);
    write_text(*dir / "sub" / "precious.txt", "mine");
    fs::resize_file(*dir / "kernel.cubin", 1);
    EXPECT_FALSE(store.load(id));
    EXPECT_TRUE(fs::exists(*dir / "sub" / "precious.txt"));
    EXPECT_TRUE(fs::exists(*dir / "kernel.cubin"));
    EXPECT_FALSE(store.publish(id, make_entry("s")));  // cannot replace it either
    EXPECT_TRUE(fs::exists(*dir / "sub" / "precious.txt"));
    bool left = false;
    for (const auto& l : w.lines) left |= l.find("left in place") != std::string::npos;
    EXPECT_TRUE(left);
}

// The clear of a cache removes the partition folders its entries emptied, not folders it finds
// empty, and keeps the root's tag.
TEST(CacheStore, ClearRemovesOnlyTheFoldersItsEntriesEmptied) {
    gj::test::ScratchDir tmp("clearfolders");
    Store store({tmp.path(), Mode::ReadWrite, 0, nullptr});
    ASSERT_TRUE(store.publish(make_id("a"), make_entry("s")));
    EntryId other = make_id("b");
    other.arch = "sm_80";
    ASSERT_TRUE(store.publish(other, make_entry("s")));
    fs::create_directories(tmp.path() / "v1" / "sm_70" / "empty");
    EXPECT_EQ(store.clear(), 2u);
    EXPECT_FALSE(fs::exists(tmp.path() / "v1" / "sm_90"));
    EXPECT_FALSE(fs::exists(tmp.path() / "v1" / "sm_80"));
    EXPECT_TRUE(fs::exists(tmp.path() / "v1" / "sm_70" / "empty"));
    EXPECT_TRUE(fs::exists(tmp.path() / kCacheDirTag));
}

// A cache made before the tag existed keeps working: read, maintained, and tagged by its next
// publish.
TEST(CacheStore, AnUntaggedCacheIsReadAndTaggedOnItsNextPublish) {
    gj::test::ScratchDir tmp("untagged");
    Store store({tmp.path(), Mode::ReadWrite, 0, nullptr});
    ASSERT_TRUE(store.publish(make_id("a"), make_entry("s")));
    fs::remove(tmp.path() / kCacheDirTag);
    Store again({tmp.path(), Mode::ReadWrite, 0, nullptr});
    EXPECT_TRUE(again.load(make_id("a")));
    EXPECT_EQ(again.stat().entries, 1u);
    EXPECT_FALSE(fs::exists(tmp.path() / kCacheDirTag));
    ASSERT_TRUE(again.publish(make_id("b"), make_entry("s")));
    auto tag = read_file(tmp.path() / kCacheDirTag);
    ASSERT_TRUE(tag);
    EXPECT_TRUE(tag->starts_with("Signature: 8a477f597d28d172789f06886806bc55")) << *tag;
    EXPECT_EQ(again.prune(0).removed, 0u);
    EXPECT_EQ(again.clear(), 2u);
}

TEST(CacheStore, ReadOnlyAndOffStoresNeverPruneOrClear) {
    gj::test::ScratchDir tmp("romaint");
    EntryId id = make_id("k");
    Store rw({tmp.path(), Mode::ReadWrite, 0, nullptr});
    ASSERT_TRUE(rw.publish(id, make_entry("s")));
    for (Mode mode : {Mode::ReadOnly, Mode::Off}) {
        Store store({tmp.path(), mode, 0, nullptr});
        EXPECT_EQ(store.prune(1).removed, 0u);
        EXPECT_EQ(store.clear(), 0u);
        EXPECT_EQ(rw.probe(id), Lookup::Hit);
    }
}

// The caller's meta.json fields (check_meta) and the store's own stamps in another type make an
// entry damaged: probe says so, load deletes it with one warning naming the field, verify counts
// it, and a new publish restores it.
TEST(CacheStore, WrongTypedMetaFieldsMakeAnEntryDamaged) {
    gj::test::ScratchDir tmp("metatypes");
    Warnings w;
    StoreConfig config{tmp.path(), Mode::ReadWrite, 0, w.sink()};
    config.check_meta = [](const nlohmann::json& meta) -> std::string {
        return meta.contains("note") && !meta["note"].is_string() ? "field note is not a string"
                                                                  : "";
    };
    EntryId id = make_id("k.m");
    const std::vector<std::pair<const char*, nlohmann::json>> cases = {
        {"note", 5}, {"created", "x"}, {"last_used", 1.5}, {"note", nlohmann::json::array()}};
    for (const auto& [field, value] : cases) {
        w.lines.clear();
        Store store(config);  // a new one each time: a store warns once per entry
        ASSERT_TRUE(store.publish(id, make_entry("s")));
        EXPECT_EQ(store.probe(id), Lookup::Hit);
        auto meta = nlohmann::json::parse(*read_file(store.entry_dir(id) / "meta.json"));
        meta[field] = value;
        std::ofstream(store.entry_dir(id) / "meta.json") << meta.dump();
        EXPECT_EQ(store.probe(id), Lookup::Damaged) << field;
        auto bad = store.verify(false);
        ASSERT_EQ(bad.size(), 1u) << field;
        EXPECT_NE(bad[0].problem.find(field), std::string::npos) << bad[0].problem;
        EXPECT_FALSE(store.load(id));
        ASSERT_EQ(w.lines.size(), 1u);
        EXPECT_NE(w.lines[0].find(field), std::string::npos) << w.lines[0];
        EXPECT_FALSE(fs::exists(store.entry_dir(id)));
    }
    // A checker that throws faults the entry instead of failing the load.
    config.check_meta = [](const nlohmann::json& meta) -> std::string {
        return meta.at("missing_field").get<std::string>();
    };
    Store throwing(config);
    ASSERT_TRUE(throwing.publish(id, make_entry("s")));
    EXPECT_EQ(throwing.probe(id), Lookup::Damaged);
}
