// A one-node cluster manifest on the sim device (time factor 0) with stories15M's tokenizer,
// for tests that drive a real gateway: gateway, router, one prefill and one decode instance,
// each on its own sim executor (devices 0 and 1), every port free on 127.0.0.1.
#pragma once

#include <cstdint>
#include <string>

#include "tests/support/process.hpp"

namespace tandem::testing {

// `cluster_name` names the cluster; `http_port` is the gateway's port (the caller keeps it).
inline std::string one_node_sim_manifest(const std::string& cluster_name, uint16_t http_port) {
  std::string model = model_dir();
  std::string t = "[cluster]\nname = \"" + cluster_name + "\"\n[model]\nname = \"stories15M\"\n"
                  "path = \"" + model + "\"\nblock_tokens = 16\nmax_model_tokens = 2048\n"
                  "[sim]\ntime_factor = 0\nkv_scale = 0.0078125\nvocab = 32000\nbos_id = 1\n"
                  "eos_id = 2\nmax_position = 2048\noutput_tokens_sigma = 0\n"
                  "output_tokens_mean = 16384\noutput_tokens_max = 16384\n";
  t += "[[node]]\nname = \"local\"\nhost = \"127.0.0.1\"\nfabric_port = " +
       std::to_string(free_port()) + "\nadmin_port = " + std::to_string(free_port()) +
       "\nhttp_port = " + std::to_string(http_port) + "\n";
  for (const char* inst :
       {"role = \"gateway\"\nname = \"gateway\"\n", "role = \"router\"\nname = \"router\"\n",
        "role = \"prefill\"\nname = \"prefill\"\nexecutor = \"ep\"\n",
        "role = \"decode\"\nname = \"decode\"\nexecutor = \"ed\"\n",
        "role = \"executor\"\nname = \"ep\"\ndevice = \"sim\"\ndevices = [0]\n"
        "kv_blocks = 1024\n",
        "role = \"executor\"\nname = \"ed\"\ndevice = \"sim\"\ndevices = [1]\n"
        "kv_blocks = 1024\n"}) {
    t += std::string("[[node.instance]]\n") + inst;
  }
  return t;
}

}  // namespace tandem::testing
