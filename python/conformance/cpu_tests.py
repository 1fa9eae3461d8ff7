"""Prints the names of ``_DistTestBase``'s tests not marked for GPUs, for
``scripts/torch-conformance.sh`` (every GPU test spawns its ranks before it skips, which costs
minutes on a small machine):

    WORLD_SIZES=4 scripts/torch-conformance.sh $(python python/conformance/cpu_tests.py)

Reads the test module's source: a test is left out when one of its decorators names a GPU or
CUDA (``skip_if_lt_x_gpu``, ``skip_if_no_gpu``, ``require_n_gpus_for_nccl_backend``, ...).
"""

import ast
import importlib.util
import sys


def main():
    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    text = open(spec.origin).read()
    names = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == "_DistTestBase":
            for f in node.body:
                if not (isinstance(f, ast.FunctionDef) and f.name.startswith("test_")):
                    continue
                decs = " ".join(ast.get_source_segment(text, d) for d in f.decorator_list)
                if "gpu" not in decs.lower() and "cuda" not in decs.lower():
                    names.append(f.name)
    print(" ".join(names))
    print(f"{len(names)} tests", file=sys.stderr)


if __name__ == "__main__":
    main()
