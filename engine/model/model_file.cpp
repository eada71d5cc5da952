#include "engine/model/model_file.h"

#include "engine/gguf/reader.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer_data.h"

namespace gj::gemma4 {

std::shared_ptr<const ModelFile> ModelFile::open(const std::filesystem::path& path) {
    std::shared_ptr<ModelFile> m(new ModelFile());
    m->file_ = gguf::File::open(path);
    m->cfg_ = Config::from_gguf(*m->file_);
    return m;
}

ModelFile::~ModelFile() = default;

const std::filesystem::path& ModelFile::path() const {
    return file_->path();
}

const tok::Tokenizer& ModelFile::tokenizer() const {
    std::lock_guard<std::mutex> lock(tokenizer_mutex_);
    if (!tokenizer_) tokenizer_ = std::make_unique<tok::Tokenizer>(tok::read_vocab(*file_));
    return *tokenizer_;
}

}  // namespace gj::gemma4
