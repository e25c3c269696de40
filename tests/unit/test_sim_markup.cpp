// The sim device's markup from a served model's tokenizer and chat format
// (actors/executor/sim_markup): on `tandem model synth --arch minimax-m2`'s tokenizer, whose
// added tokens are MiniMax-M2's markers, every marker is one token; plain has none; a
// reasoning_share that would do nothing is refused.
#include <doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "actors/executor/sim_markup.hpp"
#include "tools/model_synth.hpp"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

struct SynthDir {
  SynthDir() : path(fs::temp_directory_path() / ("tandem-markup-" + std::to_string(getpid()))) {
    tools::SynthOptions options;
    options.arch = devices::Arch::minimax_m2;
    Status st = tools::synth_model(options, path.string());
    REQUIRE_MESSAGE(st.ok(), st.error().describe());
  }
  ~SynthDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  fs::path path;
};

int32_t id_of(const text::Tokenizer& tokenizer, const char* marker) {
  auto id = tokenizer.special_token_id(marker);
  REQUIRE_MESSAGE(id.has_value(), marker);
  return *id;
}

}  // namespace

TEST_CASE("sim markup of the synthesized MiniMax-M2 tokenizer: single-token markers") {
  SynthDir dir;
  auto tokenizer = text::load_tokenizer(dir.path);
  REQUIRE(tokenizer.ok());
  const text::Tokenizer& t = **tokenizer;

  devices::SimMarkup minimax = actors::sim_markup_for(text::ChatFormat::minimax_m2, t);
  CHECK(minimax.reasoning_open.empty());  // the generation prompt opens <think>
  CHECK(minimax.reasoning_close == std::vector<int32_t>{id_of(t, "</think>")});
  for (const char* marker : {"<minimax:tool_call>", "</minimax:tool_call>", "<think>", "]~b]"}) {
    bool banned = std::find(minimax.banned.begin(), minimax.banned.end(),
                            std::vector<int32_t>{id_of(t, marker)}) != minimax.banned.end();
    CHECK_MESSAGE(banned, marker);
  }

  devices::SimMarkup chatml = actors::sim_markup_for(text::ChatFormat::chatml, t);
  CHECK(chatml.reasoning_open == std::vector<int32_t>{id_of(t, "<think>")});
  CHECK(chatml.reasoning_close == minimax.reasoning_close);
  CHECK(chatml.banned.size() == 4);  // <tool_call> etc.: plain text here, several tokens each
  CHECK(actors::sim_markup_for(text::ChatFormat::plain, t) == devices::SimMarkup{});
}

TEST_CASE("load_sim_markup: the manifest's format; reasoning_share refused where plain") {
  SynthDir dir;
  config::ModelSection model;
  model.path = dir.path.string();
  model.chat_format = config::ChatFormat::minimax_m2;
  devices::SimParams share = {{"reasoning_share", 0.5}};
  auto minimax = actors::load_sim_markup(model, share);
  REQUIRE_MESSAGE(minimax.ok(), minimax.error().describe());
  CHECK(minimax->reasoning_close.size() == 1);

  // auto: the synthesized tokenizer_config.json has no chat_template -> plain.
  model.chat_format = config::ChatFormat::auto_detect;
  auto plain = actors::load_sim_markup(model, {});
  REQUIRE(plain.ok());
  CHECK(*plain == devices::SimMarkup{});
  auto refused = actors::load_sim_markup(model, share);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("reasoning_share") != std::string::npos);
  CHECK(refused.error().message.find("[model] chat_format") != std::string::npos);

  model.chat_format = config::ChatFormat::chatml;
  model.path = (dir.path / "missing").string();
  CHECK_FALSE(actors::load_sim_markup(model, {}).ok());  // no tokenizer: named error
}
