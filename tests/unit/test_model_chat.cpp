// The served model's chat format: explicit in the manifest, or detected from the
// tokenizer_config.json inside the model directory / beside the model file.
#include <doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/text/model_chat.hpp"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() /
                 ("tandem-model-chat-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

config::ModelSection model_at(const fs::path& path, config::ChatFormat format) {
  config::ModelSection m;
  m.name = "m";
  m.path = path.string();
  m.chat_format = format;
  return m;
}

}  // namespace

TEST_CASE("model chat format: an explicit manifest value wins over tokenizer_config.json") {
  fs::path dir = fresh_dir("explicit");
  write(dir / "tokenizer_config.json", R"({"chat_template": "<|im_start|>{{ m }}"})");
  CHECK(text::chat_format_for(model_at(dir, config::ChatFormat::minimax_m2)).value() ==
        text::ChatFormat::minimax_m2);
  CHECK(text::chat_format_for(model_at(dir, config::ChatFormat::plain)).value() ==
        text::ChatFormat::plain);
  CHECK(text::chat_format_for(model_at(dir, config::ChatFormat::auto_detect)).value() ==
        text::ChatFormat::chatml);
  // Explicit formats never read the file: a missing model dir is fine.
  CHECK(text::chat_format_for(model_at(dir / "missing", config::ChatFormat::chatml)).value() ==
        text::ChatFormat::chatml);
  fs::remove_all(dir);
}

TEST_CASE("model chat format: auto detects from the HF directory's tokenizer_config.json") {
  fs::path dir = fresh_dir("hf");
  write(dir / "tokenizer_config.json",
        R"({"chat_template": "{% for m in messages %}]~b]{{ m.role }}{% endfor %}"})");
  CHECK(text::chat_format_for(model_at(dir, config::ChatFormat::auto_detect)).value() ==
        text::ChatFormat::minimax_m2);
  write(dir / "tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "]~b]"},)"
        R"( {"name": "default", "template": "<|im_start|>"}]})");
  CHECK(text::chat_format_for(model_at(dir, config::ChatFormat::auto_detect)).value() ==
        text::ChatFormat::chatml);
  write(dir / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  CHECK(text::chat_format_for(model_at(dir, config::ChatFormat::auto_detect)).value() ==
        text::ChatFormat::plain);
  fs::remove_all(dir);
}

TEST_CASE("model chat format: a model file looks beside itself; none there -> plain") {
  fs::path dir = fresh_dir("file");
  write(dir / "model.bin", "x");
  CHECK(text::tokenizer_config_path(dir / "model.bin") == dir / "tokenizer_config.json");
  CHECK(text::tokenizer_config_path(dir) == dir / "tokenizer_config.json");
  CHECK(text::chat_format_for(model_at(dir / "model.bin", config::ChatFormat::auto_detect))
            .value() == text::ChatFormat::plain);
  write(dir / "tokenizer_config.json", R"({"chat_template": "<|im_start|>"})");
  CHECK(text::chat_format_for(model_at(dir / "model.bin", config::ChatFormat::auto_detect))
            .value() == text::ChatFormat::chatml);
  fs::remove_all(dir);
}

TEST_CASE("model chat format: a broken tokenizer_config.json is an error naming the file") {
  fs::path dir = fresh_dir("broken");
  write(dir / "tokenizer_config.json", "{not json");
  auto r = text::chat_format_for(model_at(dir, config::ChatFormat::auto_detect));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().kind == ErrorKind::invalid);
  CHECK(r.error().message.find("tokenizer_config.json") != std::string::npos);
  write(dir / "tokenizer_config.json", R"({"chat_template": 7})");
  auto r2 = text::chat_format_for(model_at(dir, config::ChatFormat::auto_detect));
  REQUIRE_FALSE(r2.ok());
  CHECK(r2.error().message.find("chat_template") != std::string::npos);
  auto r3 = text::chat_format_for(model_at("", config::ChatFormat::auto_detect));
  REQUIRE_FALSE(r3.ok());
  CHECK(r3.error().message.find("model.path") != std::string::npos);
  fs::remove_all(dir);
}
