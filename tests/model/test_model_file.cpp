// ModelFile: one open and parse of a GGUF shared by its consumers. The config and tokenizer equal
// what a separate parse gives, the tokenizer is built once, a model loaded from the file keeps the
// mapping alive after the caller lets go of it, and bad files fail with the path named.
#include <gtest/gtest.h>

#include <fstream>
#include <thread>
#include <vector>

#include "engine/cpu/cpu_forward.h"
#include "engine/gguf/reader.h"
#include "engine/model/model_file.h"
#include "engine/model/synth.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer_data.h"
#include "tests/support/test_env.h"

using gj::gemma4::ModelFile;

namespace {

std::filesystem::path tiny_model(const gj::test::ScratchDir& dir) {
    gj::synth::Options o;
    o.variant = "tiny";
    o.threads = 2;
    const auto path = dir.path() / "tiny.gguf";
    gj::synth::write_model(o, path);
    return path;
}

}  // namespace

TEST(ModelFile, ConfigAndTokenizerMatchASeparateParse) {
    gj::test::ScratchDir dir("model-file");
    const auto path = tiny_model(dir);
    const auto file = ModelFile::open(path);
    EXPECT_EQ(file->path(), path);

    const auto separate = gj::gguf::File::open(path);
    const auto cfg = gj::gemma4::Config::from_gguf(*separate);
    EXPECT_EQ(file->config().summary(), cfg.summary());
    EXPECT_EQ(file->gguf().tensors().size(), separate->tensors().size());

    const gj::tok::VocabData vocab = gj::tok::read_vocab(*separate);
    const gj::tok::Tokenizer& tokenizer = file->tokenizer();
    EXPECT_EQ(tokenizer.vocab().tokens, vocab.tokens);
    EXPECT_EQ(tokenizer.vocab().chat_template, vocab.chat_template);
    EXPECT_EQ(tokenizer.vocab_size(), file->config().vocab_size);
}

TEST(ModelFile, TheTokenizerIsBuiltOnceForAllThreads) {
    gj::test::ScratchDir dir("model-file-once");
    const auto file = ModelFile::open(tiny_model(dir));
    std::vector<const gj::tok::Tokenizer*> seen(4, nullptr);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < seen.size(); ++i)
        threads.emplace_back([&, i] { seen[i] = &file->tokenizer(); });
    for (auto& t : threads) t.join();
    for (const auto* t : seen) EXPECT_EQ(t, seen[0]);
    EXPECT_EQ(&file->tokenizer(), seen[0]);
}

// The CPU model binds its weights into the mapping: it must hold the file, not borrow it.
TEST(ModelFile, AModelKeepsItsFileAlive) {
    gj::test::ScratchDir dir("model-file-alive");
    const auto path = tiny_model(dir);
    gj::gemma4::CpuOptions co;
    co.threads = 2;
    co.weights.f32_copy_limit_bytes = 0;  // read rows from the mapping on demand
    const auto reference = gj::gemma4::CpuModel::load(path, co);
    auto file = ModelFile::open(path);
    std::weak_ptr<const ModelFile> watch = file;
    const auto model = gj::gemma4::CpuModel::load(std::move(file), co);
    ASSERT_FALSE(watch.expired());
    EXPECT_EQ(&model->config(), &model->file().config());

    gj::gemma4::CpuSession a(*model), b(*reference);
    const std::vector<int32_t> tokens = {2, 10, 20, 30};
    EXPECT_EQ(a.prefill(tokens), b.prefill(tokens));
}

TEST(ModelFile, BadFilesNameThePath) {
    gj::test::ScratchDir dir("model-file-bad");
    const auto missing = dir.path() / "missing.gguf";
    try {
        ModelFile::open(missing);
        FAIL() << "opened a missing file";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
    }
    const auto junk = dir.path() / "junk.gguf";
    std::ofstream(junk) << "not a gguf file at all";
    EXPECT_THROW(ModelFile::open(junk), std::runtime_error);
}
