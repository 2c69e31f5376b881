"""Every op of every installed plugin, on every backend this machine has: numerics against the
float64 reference, bad inputs generated from the op's spec, torch.compile and CUDA graphs
(:mod:`sgljit.testing`)."""

from sgljit.testing import conformance

test_conformance = conformance()
