"""The one thing pyproject.toml cannot say: the media path's optional C kernels.

``optional=True``: where no C compiler is found the build goes on without them, and
each kernel's user runs its numpy twin instead (media/compiled.py; ``rutster serve``
logs which it uses).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rutster.media._kernels",
            sources=["media/_kernels.c"],
            # No fused multiply-adds: a*b+c rounded once would part from two roundings,
            # and the echo gate's own kernels must give numpy's results bit for bit, the
            # line canceller's step plain index-order arithmetic's on every CPU.
            extra_compile_args=["-ffp-contract=off"],
            optional=True,
        ),
        # Silero's 8 kHz network (media/silero_kernel.py): its own module, built with the
        # compiler's default contraction (multiply-adds fused): its results are held to
        # onnxruntime's within a tolerance, not to numpy's bit for bit.
        Extension("rutster.media._silero", sources=["media/_silero.c"], optional=True),
    ]
)
