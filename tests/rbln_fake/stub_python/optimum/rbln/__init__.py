# Stand-in for optimum-rbln (tests only): records what tools/rbln-compile asks of
# RBLNAutoModelForCausalLM.from_pretrained in $RBLN_STUB_LOG (JSON) and writes one file per
# graph the rbln_config names on save_pretrained, in a subdirectory as the real one may.
# $RBLN_STUB_FAIL: from_pretrained raises with that message; $RBLN_STUB_SKIP: that graph is
# not written.
import json
import os


class _Compiled:
    def __init__(self, config):
        self.config = config

    def save_pretrained(self, directory):
        graphs = ["prefill"] + ["decoder_batch_%d" % b for b in self.config["decoder_batch_sizes"]]
        os.makedirs(os.path.join(directory, "compiled"), exist_ok=True)
        for g in graphs:
            if g == os.environ.get("RBLN_STUB_SKIP"):
                continue
            with open(os.path.join(directory, "compiled", g + ".rbln"), "w") as f:
                f.write("stub graph " + g + "\n")


class RBLNAutoModelForCausalLM:
    @classmethod
    def from_pretrained(cls, model_id, **kwargs):
        if os.environ.get("RBLN_STUB_FAIL"):
            raise RuntimeError(os.environ["RBLN_STUB_FAIL"])
        with open(os.environ["RBLN_STUB_LOG"], "w") as f:
            json.dump({"model_id": model_id, "kwargs": kwargs}, f)
        return _Compiled(kwargs["rbln_config"])
