"""cuda_library: .cu files compiled by nvcc into a cc_library that normal cc_* targets link.

nvcc comes from the CUDA toolkit at /usr/local/cuda (CUDA 13). Device code is built for Hopper
(sm_90a SASS, which the wgmma/TMA paths need) plus compute_90 PTX that the driver JIT-compiles on
newer GPUs. Building needs no GPU; running a kernel without one fails with a Status that says so
(see kernels/cuda/device.h).

Rules of the road (STYLE.md 3, 8): a .cu file includes only host-only launcher headers of this
project and CUDA's own headers; no CUDA type appears in a header that host code includes.
"""

CUDA_HOME = "/usr/local/cuda"

NVCC_ARCH_FLAGS = [
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_90,code=compute_90",
]

def cuda_library(name, srcs, hdrs = [], deps = [], nvcc_hdrs = [], nvcc_flags = [], visibility = None, **kwargs):
    """Compiles each .cu in `srcs` with nvcc (-fPIC, C++20, -O3) and wraps the objects.

    Args:
      name: the resulting cc_library.
      srcs: .cu files.
      hdrs: host-only headers of this library (launcher declarations), visible to dependents and
        to nvcc.
      deps: cc_library targets linked as usual.
      nvcc_hdrs: headers of other targets (files or filegroups) that the .cu files include; nvcc
        runs sandboxed and sees only these, `hdrs` and the sources.
      nvcc_flags: extra nvcc flags.
      visibility: as usual.
      **kwargs: passed to the cc_library (tags, testonly, ...).
    """
    objs = []
    for src in srcs:
        base = src[:-len(".cu")]
        obj = "_cuda_objs/" + name + "/" + base + ".o"
        objs.append(obj)
        native.genrule(
            name = name + "_" + base.replace("/", "_") + "_nvcc",
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            cmd = " ".join([
                "NVCC=" + CUDA_HOME + "/bin/nvcc;",
                "[ -x $$NVCC ] || { echo \"nvcc not found at $$NVCC: install the CUDA 13 toolkit\" >&2; exit 1; };",
                "$$NVCC -c -std=c++20 -O3 -Xcompiler -fPIC --expt-relaxed-constexpr",
                " ".join(NVCC_ARCH_FLAGS),
                " ".join(nvcc_flags),
                "-I. -I$(GENDIR) -I$(BINDIR)",
                "-o $@ $(location " + src + ")",
            ]),
            message = "nvcc " + src,
        )

    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//third_party:cuda_runtime"],
        # Link the objects into each binary (not a per-library .so) so that the static CUDA
        # runtime that follows them on the link line resolves their references.
        linkstatic = True,
        visibility = visibility,
        **kwargs
    )
