"""A beta of macOS is told from a release by its build (mlxops.readiness.beta_build). The
builds are real ones quoted from Macs: 23E224 (macOS 14.4.1, Ansible's recorded sysctl),
24F74 (15.5), 25F80 (26.5.1, ml-explore/mlx#3777), 26A428 (27.0, ashhart/MCDMA#3),
22E772610a (a Rapid Security Response of 13.3.1). The betas (25A5316i, ...) are written
here in a seed's form (a build number from 5000 with a letter), not quoted from a Mac."""

from __future__ import annotations

import pytest

from mlxops.readiness import beta_build


@pytest.mark.parametrize("build", ["23E224", "24F74", "25F80", "26A428", "22E772610a"])
def test_releases_are_not_betas(build):
    assert not beta_build(build)


@pytest.mark.parametrize("build", ["25A5316i", "26A5288h", "24A5264n"])
def test_seeds_are_betas(build):
    assert beta_build(build)


@pytest.mark.parametrize("build", [None, "", "unknown"])
def test_an_unknown_build_is_not_called_a_beta(build):
    assert not beta_build(build)
