#!/usr/bin/env python3
"""Compile every kernel family the way lode's run-time path does (NVRTC, the family's
source with its headers inlined as `kernels::family_source` does, the
options of `driver/cuda` `rtc_compile`), without a GPU: NVRTC needs none. A GPU whose
architecture has no embedded code object (anything but sm_90) takes this path, so a kernel
that nvcc accepts and NVRTC rejects would break those GPUs; this catches it in CI.

usage: nvrtc-check.py LIBNVRTC [ARCH ...]   (default archs: sm_90 sm_80)
"""
import ctypes, pathlib, sys

root = pathlib.Path(__file__).resolve().parent.parent / "kernels-hip"
lib = ctypes.CDLL(sys.argv[1])
archs = sys.argv[2:] or ["sm_90", "sm_80"]
inline = {f'#include "{h.name}"': h.read_text() for h in sorted(root.glob("*.h"))}

def source(path):
    s = path.read_text()
    for inc, text in inline.items():
        s = s.replace(inc, text)
    return s

def compile(name, src, arch):
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None) != 0:
        return "nvrtcCreateProgram failed"
    opts = [f"--gpu-architecture={arch}", "-default-device", "--std=c++17"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return None if rc == 0 else log.value.decode(errors="replace")[-3000:]

failed = 0
for path in sorted(root.glob("*.hip")):
    for arch in archs:
        err = compile(path.name, source(path), arch)
        print(f"{path.name:24} {arch}: {'ok' if err is None else 'FAILED'}")
        if err is not None:
            failed += 1
            print(err)
sys.exit(1 if failed else 0)
