"""Every distribution's sources carry what a package index needs (fast; the wheels themselves
are checked in test_wheels.py): the Apache-2.0 LICENSE, py.typed, the repository's URLs,
classifiers, a README whose links are absolute, upper bounds on the SDKs verified at one version."""

from __future__ import annotations

import re

import pytest
import tomllib
from dists import DISTS, EXAMPLE, REPOSITORY, ROOT

ALL = (*DISTS, EXAMPLE)


def project(dist: str) -> dict:
    return tomllib.loads((ROOT / dist / "pyproject.toml").read_text())["project"]


def test_the_root_license_is_the_full_apache_2_text():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply" in text
    assert len(text) > 10_000


@pytest.mark.parametrize("dist", ALL)
def test_each_distribution_ships_the_license_and_py_typed(dist):
    meta = project(dist)
    assert meta["license"] == "Apache-2.0"
    assert meta["license-files"] == ["LICENSE"]
    assert (ROOT / dist / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    packages = [p for p in (ROOT / dist / "src").iterdir() if (p / "__init__.py").is_file()]
    assert packages
    for package in packages:
        assert (package / "py.typed").is_file(), f"{package} has no py.typed"


@pytest.mark.parametrize("dist", ALL)
def test_urls_and_classifiers_name_the_one_repository(dist):
    meta = project(dist)
    urls = meta["urls"]
    assert urls["Repository"] == REPOSITORY and urls["Homepage"] == REPOSITORY
    assert urls["Issues"] == f"{REPOSITORY}/issues"
    assert urls["Documentation"].startswith(f"{REPOSITORY}/blob/main/")
    doc = urls["Documentation"].removeprefix(f"{REPOSITORY}/blob/main/")
    assert (ROOT / doc).is_file(), f"{dist}: Documentation names {doc}, which does not exist"
    assert "Typing :: Typed" in meta["classifiers"]
    assert not any(
        c.startswith("License ::") for c in meta["classifiers"]
    )  # PEP 639: the expression


LINK = re.compile(r"\]\(([^)\s]+)\)|<(https?://[^>]+)>|\bsrc=\"([^\"]+)\"")


@pytest.mark.parametrize("dist", ALL)
def test_readme_links_are_absolute(dist):
    """An index shows the README without the repository: a relative link would be broken."""
    meta = project(dist)
    assert meta["readme"] == "README.md"
    text = (ROOT / dist / "README.md").read_text()
    for match in LINK.finditer(text):
        link = next(g for g in match.groups() if g)
        assert link.startswith("https://"), f"{dist}/README.md links to {link!r}"
        if link.startswith(f"{REPOSITORY}/blob/main/"):
            target = link.removeprefix(f"{REPOSITORY}/blob/main/").split("#")[0]
            assert (ROOT / target).exists(), f"{dist}/README.md links to missing {target}"


def test_sdks_verified_at_one_version_are_bounded_above():
    deps = {
        d.split(">")[0].split("<")[0].split("=")[0]: d
        for d in project("yeto_modal")["dependencies"]
    }
    assert deps["modal"] == "modal>=1.6,<1.7"  # docs/modal.md: verified against modal 1.6.4
    sky = [d for d in project("yeto_sky")["dependencies"] if d.startswith("skypilot")]
    assert sky == ["skypilot>=0.14,<0.15"]  # docs/sky.md: skypilot 0.14


def test_yeto_core_testing_extra_brings_the_contract_suites_tools():
    extra = project("yeto_core")["optional-dependencies"]["testing"]
    assert {re.split(r"[<>=]", r)[0] for r in extra} == {"pytest", "hypothesis"}


def test_the_makefile_builds_every_distribution():
    make = (ROOT / "Makefile").read_text()
    listed = re.search(r"^DISTS := (.*?)\n\S", make, re.S | re.M).group(1)
    assert tuple(listed.replace("\\", " ").split()) == DISTS
    assert re.search(r"^wheels: ", make, re.M)
