"""Each distribution's metadata, checked on its pyproject.toml, package folder and installed metadata:
license files, classifiers, bounded dependencies between our packages, one source for each version,
extras that exist where an error message names them, READMEs whose links work on an index page."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import pathlib
import re
import sys

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli below Python 3.11
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIST_DIRS = sorted(
    p.parent for p in ROOT.glob("*/*/pyproject.toml") if p.parts[-3] in ("packages", "apps")
)
PROJECTS = {d: tomllib.loads((d / "pyproject.toml").read_text())["project"] for d in DIST_DIRS}
OURS = {p["name"]: d for d, p in PROJECTS.items()}
IDS = [d.name for d in DIST_DIRS]


def test_every_workspace_member_is_checked():
    assert sorted(OURS) == sorted(
        [
            "modality-index",
            "seqpar-approx",
            "sparse-kernels",
            "sparse-patterns",
            "spava-run",
            "triangle-mix",
            "vlm-accel",
        ]
    )


@pytest.mark.parametrize("d", DIST_DIRS, ids=IDS)
def test_license_and_descriptive_metadata(d):
    project = PROJECTS[d]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (d / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the full text, not a notice
    classifiers = project["classifiers"]
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert "Programming Language :: Python :: 3 :: Only" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # superseded by `license`
    assert project["authors"] and project["keywords"]
    assert project["readme"] == "README.md" and (d / "README.md").is_file()
    urls = project.get("urls", {})
    assert not [u for u in urls.values() if re.search(r"example\.|TODO|<|>", u)]
    changelog = (d / "CHANGELOG.md").read_text()
    assert f"## {project['version']} " in changelog


@pytest.mark.parametrize("d", DIST_DIRS, ids=IDS)
def test_dependencies_between_our_packages_are_bounded(d):
    project = PROJECTS[d]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for rs in project.get("optional-dependencies", {}).values() for r in rs]
    for req in reqs:
        if req.name not in OURS:
            continue
        version = Version(PROJECTS[OURS[req.name]]["version"])
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops and "<" in ops, f"{project['name']}: {req} has no lower and upper bound"
        assert version in req.specifier, f"{project['name']}: {req} excludes {req.name} {version}"


def test_numpy_is_declared_for_the_triton_interpreter():
    names = {Requirement(r).name for r in PROJECTS[OURS["sparse-kernels"]]["dependencies"]}
    assert "numpy" in names


@pytest.mark.parametrize("d", DIST_DIRS, ids=IDS)
def test_version_comes_from_the_package_metadata(d):
    project = PROJECTS[d]
    import_name = project["name"].replace("-", "_")
    init = d / "src" / import_name / "__init__.py"
    values = [
        node.value
        for node in ast.walk(ast.parse(init.read_text()))
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
    ]
    # read from the metadata; the only literal is the marker of a source folder that is not installed
    from_metadata = [
        v
        for v in values
        if isinstance(v, ast.Call)
        and isinstance(v.func, ast.Attribute)
        and v.func.attr == "version"
        and [ast.literal_eval(a) for a in v.args] == [project["name"]]
    ]
    literals = [v.value for v in values if isinstance(v, ast.Constant)]
    assert from_metadata and set(literals) <= {"0+unknown"}, f"{init}: __version__ {literals}"
    try:
        installed = importlib.metadata.version(project["name"])
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{project['name']} is not installed (its source folder is on PYTHONPATH)")
    module = importlib.import_module(import_name)
    assert module.__version__ == installed == project["version"]


# `pip install "sparse-kernels[viz]"` or pip install 'triangle-mix[hf]' in an error message or doc
EXTRA_MENTION = re.compile(r"([a-z][a-z-]+)\[([a-z0-9,-]+)\]")


@pytest.mark.parametrize("d", DIST_DIRS, ids=IDS)
def test_extras_named_in_messages_and_readmes_exist(d):
    texts = [f.read_text() for f in sorted((d / "src").rglob("*.py"))] + [
        (d / "README.md").read_text()
    ]
    for text in texts:
        for name, extras in EXTRA_MENTION.findall(text):
            if name not in OURS:
                continue
            declared = PROJECTS[OURS[name]].get("optional-dependencies", {})
            for extra in extras.split(","):
                assert extra in declared, f"{d.name} names {name}[{extra}], not an extra of {name}"


MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)[^)]*\)")


@pytest.mark.parametrize("d", DIST_DIRS, ids=IDS)
def test_readme_links_are_absolute(d):
    """The README is the package's page on an index, where a relative link leads nowhere."""
    links = MD_LINK.findall((d / "README.md").read_text())
    assert [u for u in links if not u.startswith("https://")] == []
