// `tandem model synth`: writes a small HF-style model with deterministic random weights.
#include <chrono>
#include <cstdio>
#include <string>
#include <variant>

#include "actors/executor/executor_actor.hpp"
#include "config/manifest.hpp"
#include "devices/cpu/weights.hpp"
#include "devices/rbln/rbln_compile.hpp"
#include "tools/commands.hpp"
#include "tools/model_synth.hpp"

namespace tandem::tools {
namespace {

struct IntFlag {
  const char* name;
  uint32_t SynthOptions::*field;
  const char* help;
};

constexpr IntFlag kIntFlags[] = {
    {"layers", &SynthOptions::layers, "decoder layers (default 2)"},
    {"hidden", &SynthOptions::hidden, "hidden size (default 64)"},
    {"heads", &SynthOptions::heads, "query heads (default 4)"},
    {"kv-heads", &SynthOptions::kv_heads, "key/value heads, divides --heads (default 2)"},
    {"head-dim", &SynthOptions::head_dim, "head dimension, even (default 16)"},
    {"ffn", &SynthOptions::ffn,
     "llama: MLP width (default 128); minimax-m2: each expert's width (default 32)"},
    {"experts", &SynthOptions::experts, "minimax-m2: experts per layer (default 4)"},
    {"experts-per-token", &SynthOptions::experts_per_token,
     "minimax-m2: experts routed per token (default 2)"},
    {"rotary-dim", &SynthOptions::rotary_dim,
     "rotated dims per head (default: head-dim for llama, head-dim/2 for minimax-m2)"},
    {"vocab", &SynthOptions::vocab, "vocabulary size incl. 256 bytes + specials (default 512)"},
    {"max-position", &SynthOptions::max_position, "max_position_embeddings (default 256)"},
    {"shards", &SynthOptions::shards,
     "safetensors files; N > 1: model-0000i-of-0000N.safetensors + index.json (default 1)"},
};

// --arch eagle3: a draft head for the model at --target.
int synth_eagle3_head(const cli::Flags& flags) {
  auto fail = [](const std::string& why, int code) {
    std::fprintf(stderr, "tandem model synth: %s\n", why.c_str());
    return code;
  };
  if (flags.get("target").empty()) return fail("--arch eagle3 needs --target DIR (the model)", 2);
  for (const IntFlag& f : kIntFlags) {
    if (flags.has(f.name) && std::string(f.name) != "ffn") {
      return fail(std::string("--") + f.name + " does not apply to --arch eagle3 (the head " +
                      "takes the target's shape)",
                  2);
    }
  }
  auto target = devices::cpu::load_model(flags.get("target"));
  if (!target) return fail("--target " + flags.get("target") + ": " + target.error().message, 1);
  Eagle3SynthOptions o;
  auto seed = flags.get_int("seed");
  if (!seed) return 2;
  o.seed = static_cast<uint64_t>(*seed);
  for (auto [name, field] : {std::pair{"draft-vocab", &Eagle3SynthOptions::draft_vocab},
                             std::pair{"ffn", &Eagle3SynthOptions::ffn}}) {
    if (!flags.has(name)) continue;
    auto v = flags.get_int(name);
    if (!v) return 2;
    if (*v <= 0 || *v > 0xffffffffLL) return fail(std::string("--") + name + " out of range", 2);
    o.*field = static_cast<uint32_t>(*v);
  }
  if (flags.get("dtype") != "f32") return fail("--arch eagle3 writes f32 weights", 2);
  if (Status st = synth_eagle3(target->config, o, flags.get("out")); !st) {
    return fail(st.error().message, st.error().kind == ErrorKind::invalid ? 2 : 1);
  }
  std::printf("wrote %s (eagle3 head for %s, seed %llu)\n", flags.get("out").c_str(),
              flags.get("target").c_str(), static_cast<unsigned long long>(o.seed));
  return 0;
}

int synth(cli::Args args) {
  cli::Flags flags("tandem model synth --arch llama|minimax-m2|eagle3 --out DIR [flags]",
                   "Writes a small model with deterministic random weights as an HF-style\n"
                   "directory: config.json, model.safetensors, tokenizer.json (byte-level BPE),\n"
                   "tokenizer_config.json. Same flags and seed -> identical files.\n"
                   "--shards N splits the weights as HF does (model.safetensors.index.json).\n"
                   "--arch eagle3 --target DIR writes an EAGLE-3 draft head for that model\n"
                   "(config.json, model.safetensors with fc, midlayer.*, lm_head, d2t).");
  flags.flag("arch", "ARCH", "llama, minimax-m2 or eagle3 (required)");
  flags.flag("target", "DIR", "eagle3: the target model (HF directory or llama2.c file)");
  flags.flag("draft-vocab", "N", "eagle3: draft vocabulary (default: the target's / 4)");
  flags.flag("out", "DIR", "output directory, created if missing (required)");
  for (const IntFlag& f : kIntFlags) flags.flag(f.name, "N", f.help);
  flags.flag("seed", "S", "weight seed", "0");
  flags.flag("dtype", "TYPE", "f32, bf16 or f16", "f32");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "tandem model synth: %s\n", why.c_str());
    return 2;
  };
  SynthOptions o;
  std::string arch = flags.get("arch");
  if (arch == "llama") {
    o.arch = devices::Arch::llama;
  } else if (arch == "minimax-m2") {
    o.arch = devices::Arch::minimax_m2;
    o.ffn = 32;
  } else if (arch != "eagle3") {
    return fail("--arch must be llama, minimax-m2 or eagle3, got '" + arch + "'");
  }
  if (flags.get("out").empty()) return fail("--out DIR is required");
  if (arch == "eagle3") return synth_eagle3_head(flags);
  for (const char* only : {"target", "draft-vocab"}) {
    if (flags.has(only)) return fail(std::string("--") + only + " applies to --arch eagle3");
  }
  for (const IntFlag& f : kIntFlags) {
    if (!flags.has(f.name)) continue;
    auto v = flags.get_int(f.name);
    if (!v) return 2;
    if (*v < 0 || *v > 0xffffffffLL) return fail(std::string("--") + f.name + " out of range");
    o.*(f.field) = static_cast<uint32_t>(*v);
  }
  auto seed = flags.get_int("seed");
  if (!seed) return 2;
  o.seed = static_cast<uint64_t>(*seed);
  std::string dtype = flags.get("dtype");
  if (dtype == "f32") {
    o.dtype = devices::DType::f32;
  } else if (dtype == "bf16") {
    o.dtype = devices::DType::bf16;
  } else if (dtype == "f16") {
    o.dtype = devices::DType::f16;
  } else {
    return fail("--dtype must be f32, bf16 or f16, got '" + dtype + "'");
  }
  if (Status st = synth_model(o, flags.get("out")); !st) {
    fail(st.error().message);
    return st.error().kind == ErrorKind::invalid ? 2 : 1;
  }
  std::printf("wrote %s (%s, seed %llu)\n", flags.get("out").c_str(), arch.c_str(),
              static_cast<unsigned long long>(o.seed));
  return 0;
}

}  // namespace

// `tandem model compile --manifest M`: every rbln executor's graphs into the compile cache.
int compile(cli::Args args) {
  cli::Flags flags("tandem model compile --manifest MANIFEST",
                   "Runs [rbln] compiler once per rbln executor for all the graphs it needs\n"
                   "(prefill and one decode graph per bucket, compiled together: they share\n"
                   "the device's KV cache; a prefill executor's pipeline stages under [rbln]\n"
                   "prefill_pipeline_stages; a decode executor's rank graphs under\n"
                   "decode_data_parallel), into [rbln] cache_dir, keyed by the model's\n"
                   "fingerprint, shapes, buckets, block size, max length, device split and the\n"
                   "compiler's version (docs/rbln.md). What is cached already is\n"
                   "kept. Prints one line per executor. Exits 1 when a compile fails or the\n"
                   "manifest has no rbln executor with a compiler, 2 on a bad command line.");
  flags.flag("manifest", "FILE", "the cluster manifest", "");
  int exit_code = 0;
  if (!flags.parse(args, &exit_code)) return exit_code;
  if (flags.get("manifest").empty()) {
    std::fprintf(stderr, "tandem model compile: --manifest is required\n");
    return 2;
  }
  auto loaded = config::load_manifest(flags.get("manifest"));
  if (const auto* errors = std::get_if<config::ManifestErrors>(&loaded)) {
    for (const auto& issue : errors->issues) std::fprintf(stderr, "%s\n", issue.describe().c_str());
    return 1;
  }
  const auto& manifest = std::get<config::Manifest>(loaded);
  if (manifest.rbln.compiler.empty()) {
    std::fprintf(stderr, "tandem model compile: %s sets no [rbln] compiler\n",
                 manifest.file.c_str());
    return 1;
  }
  int executors = 0;
  for (const config::Node& node : manifest.nodes) {
    for (const config::Instance& instance : node.instances) {
      if (instance.role != config::Role::executor || instance.device != config::DeviceKind::rbln) {
        continue;
      }
      ++executors;
      auto started = std::chrono::steady_clock::now();
      const devices::DeviceSpec spec = actors::device_spec(manifest, instance);
      if (spec.rbln.compiler.empty()) {  // a prefill executor on [rbln] prefill_artifacts
        std::printf("%s/%s: uses %s (prefill_artifacts), nothing to compile\n", node.name.c_str(),
                    instance.name.c_str(), spec.rbln.artifacts.c_str());
        continue;
      }
      auto request = devices::rbln::compile_request(spec);
      auto done = devices::rbln::compile(request, manifest.rbln.compiler, manifest.rbln.cache_dir);
      if (!done.ok()) {
        std::fprintf(stderr, "%s/%s: %s\n", node.name.c_str(), instance.name.c_str(),
                     done.error().message.c_str());
        exit_code = 1;
        continue;
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      // How the executor's devices split (rbln_compile.hpp), when they do.
      std::string split;
      const uint32_t parts = std::max(request.stages, request.ranks);
      if (parts > 1) {
        split = " for " + std::to_string(parts) +
                (request.stages > 1 ? " pipeline stages" : " data-parallel ranks") + " of " +
                std::to_string(request.devices) +
                (request.devices == 1 ? " device each" : " devices each");
      }
      if (request.verify_tokens > 0) {
        split += " (with verify graphs of " + std::to_string(request.verify_tokens) +
                 " tokens per sequence)";
      }
      if (done->cached) {
        std::printf("%s/%s: cached%s %s\n", node.name.c_str(), instance.name.c_str(), split.c_str(),
                    done->dir.c_str());
      } else {
        std::printf("%s/%s: compiled %u graphs%s in %.1f s into %s\n", node.name.c_str(),
                    instance.name.c_str(), done->graphs, split.c_str(), s, done->dir.c_str());
      }
    }
  }
  if (executors == 0) {
    std::fprintf(stderr, "tandem model compile: %s has no executor with device \"rbln\"\n",
                 manifest.file.c_str());
    return 1;
  }
  return exit_code;
}

int cmd_model(cli::Args args) {
  if (args.empty() || std::string(args[0]) == "--help" || std::string(args[0]) == "-h") {
    std::fprintf(args.empty() ? stderr : stdout,
                 "usage: tandem model SUBCOMMAND\n\n  synth   write a small random model "
                 "(tandem model synth --help)\n  compile compile the rbln executors' graphs "
                 "into the compile cache (tandem model compile --help)\n");
    return args.empty() ? 2 : 0;
  }
  if (std::string(args[0]) == "synth") return synth(args.subspan(1));
  if (std::string(args[0]) == "compile") return compile(args.subspan(1));
  std::fprintf(stderr, "tandem model: unknown subcommand '%s' (try: synth, compile)\n", args[0]);
  return 2;
}

}  // namespace tandem::tools
