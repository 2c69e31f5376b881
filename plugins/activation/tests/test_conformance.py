"""Every op of sgljit-activation on every backend this machine has (sgljit.testing): numerics against the
float64 reference on each declared case, bad inputs generated from the spec (each error must name
its argument), torch.compile, and CUDA graphs on a GPU. SYCL runs are marked ``sycl`` (they need
the SYCL runtime: ``pip install "sgljit[sycl]"``), CUDA runs ``gpu``."""

from sgljit.testing import conformance

test_conformance = conformance("activation")
