"""The one thing pyproject.toml cannot say: the echo gate's optional C kernels.

``optional=True``: where no C compiler is found the build goes on without them, and
the echo gate runs the same steps in numpy (media/echo_kernels.py; ``rutster serve``
logs which it uses).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rutster.media._echo_kernels",
            sources=["media/_echo_kernels.c"],
            # No fused multiply-adds: a*b+c rounded once would part from numpy's two
            # roundings, and the kernels must give numpy's results bit for bit.
            extra_compile_args=["-ffp-contract=off"],
            optional=True,
        )
    ]
)
