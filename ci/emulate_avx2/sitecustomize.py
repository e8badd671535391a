"""AVX2 emulation on an AVX-512 host: tokenmill's CPU platform reads /proc/cpuinfo without the AVX-512,
AMX and AVX-VNNI flags, as on the issue's Zen 3. Loaded through PYTHONPATH by ``env.sh``."""

import importlib.abc
import importlib.util
import sys

HIDDEN_PREFIXES = ("avx512", "amx")
HIDDEN = frozenset({"avx_vnni", "avx_vnni_int8", "avx_ifma"})


def _visible(flag: str) -> bool:
    return not flag.startswith(HIDDEN_PREFIXES) and flag not in HIDDEN


class _MaskCpuinfo(importlib.abc.MetaPathFinder):
    """Wraps ``tokenmill_cpu.cpuinfo.parse_cpuinfo`` as the module is first executed."""

    def find_spec(self, name, path, target=None):
        if name != "tokenmill_cpu.cpuinfo":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            parse = module.parse_cpuinfo

            def masked(text):
                info = parse(text)
                return module.CpuInfo(model_name=info.model_name, flags=frozenset(filter(_visible, info.flags)),
                                      core_of=info.core_of)

            module.parse_cpuinfo = masked

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _MaskCpuinfo())
