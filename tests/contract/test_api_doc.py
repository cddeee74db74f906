"""docs/api.md states the whole public contract: every public name the code has is on it,
the repository refers to no contract outside itself, and the pages it links exist."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterable
from pathlib import Path

import flightgroup
import flightgroup.asgi
import flightgroup.otel
import flightgroup.prometheus
import flightgroup.testing
import flightgroup.typed
from flightgroup import errors
from flightgroup.decorator import Coalesced

ROOT = Path(__file__).resolve().parents[2]
API_DOC = ROOT / "docs" / "api.md"
GLOSSARY = ROOT / "docs" / "glossary.md"
README = ROOT / "README.md"

# The file name of the contract that lives outside the repository (spelled in two parts so
# that this test does not name it itself).
OUTSIDE_CONTRACT = "API" + ".md"


def _public(names: Iterable[str]) -> set[str]:
    return {name for name in names if not name.startswith("_")}


def _parameters(function: object) -> set[str]:
    """The names of ``function``'s parameters (self and *args/**kwargs left out)."""
    signature = inspect.signature(function)  # type: ignore[arg-type]
    return _public(
        name for name, parameter in signature.parameters.items()
        if name != "self"
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    )


def _placeholder(annotation: object) -> object:
    """A value of a constructor argument's annotated type, to make an error to look at."""
    text = str(annotation)
    if text.startswith("str"):
        return "k"
    if text.startswith(("int", "float")):
        return 1
    raise AssertionError(f"no placeholder for an argument annotated {text!r}")


def _error_attributes(cls: type[BaseException]) -> set[str]:
    """The public attributes an instance of ``cls`` has (made with its required
    arguments), and the public methods it adds to Exception's."""
    signature = inspect.signature(cls.__init__)
    arguments = [
        _placeholder(parameter.annotation)
        for name, parameter in signature.parameters.items()
        if name != "self"
        and parameter.default is parameter.empty
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]
    made = cls(*arguments)
    return _public(vars(made)) | (_public(dir(cls)) - set(dir(Exception)))


def public_names() -> dict[str, set[str]]:
    """Every public name of the contract, by where it comes from."""
    group = flightgroup.FlightGroup
    names = {
        "flightgroup.__all__": set(flightgroup.__all__) | {"__version__"},
        "flightgroup.testing.__all__": set(flightgroup.testing.__all__),
        "flightgroup.prometheus.__all__": set(flightgroup.prometheus.__all__),
        "flightgroup.otel.__all__": set(flightgroup.otel.__all__),
        "FlightGroup": _public(dir(group)),
        "FlightGroup()": _parameters(group.__init__),
        "FlightGroup.run": _parameters(group.run) | _parameters(group.run_sync),
        "FlightGroup.coalesce": _parameters(group.coalesce),
        "a decorated function": _public(vars(Coalesced)) | _public(Coalesced.__annotations__),
        "Result": set(flightgroup.Result._fields),
        "Stats": {field.name for field in dataclasses.fields(flightgroup.Stats)},
        "Lease": _public(dir(flightgroup.Lease)),
        "FakeCoordinator": (
            _public(dir(flightgroup.testing.FakeCoordinator))
            | _public(vars(flightgroup.testing.FakeCoordinator()))
            | _parameters(flightgroup.testing.FakeCoordinator.group)
        ),
        "FlightGroupCollector": _public(vars(flightgroup.prometheus.FlightGroupCollector)),
        "prometheus.register": _parameters(flightgroup.prometheus.register),
        "otel.instrument": _parameters(flightgroup.otel.instrument),
        "flightgroup.typed.__all__": set(flightgroup.typed.__all__),
        "TypedCodec": (
            _public(dir(flightgroup.typed.TypedCodec))
            | _parameters(flightgroup.typed.TypedCodec.__init__)
        ),
        "flightgroup.asgi.__all__": set(flightgroup.asgi.__all__),
        "CollapseRequests": _public(dir(flightgroup.asgi.CollapseRequests)),
        "CollapseRequests()": _parameters(flightgroup.asgi.CollapseRequests.__init__),
    }
    for policy in (flightgroup.Retry, flightgroup.Retention, flightgroup.Limits):
        names[policy.__name__] = {field.name for field in dataclasses.fields(policy)}
    for name in errors.__all__:
        names[name] = _error_attributes(getattr(errors, name))
    return names


def documented(text: str) -> set[str]:
    """The identifiers the page names in inline code (`name`, `name(...)`, `a.name`);
    examples in fenced blocks do not count as stating a name."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    spans = re.findall(r"`([^`]+)`", prose)
    return {word for span in spans for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}


def missing(names: dict[str, set[str]], text: str) -> dict[str, list[str]]:
    """The names of ``names`` the page does not state, by where they come from."""
    stated = documented(text)
    gaps = {where: sorted(found - stated) for where, found in names.items()}
    return {where: gap for where, gap in gaps.items() if gap}


def test_every_public_name_is_on_the_api_page() -> None:
    """docs/api.md states every public name, parameter, field and attribute of the code."""
    gaps = missing(public_names(), API_DOC.read_text())
    assert not gaps, f"docs/api.md does not state these public names: {gaps}"


def test_the_names_checked_include_the_whole_export_list() -> None:
    """The check covers every export and the members of the classes users touch."""
    names = public_names()
    assert names["flightgroup.__all__"] >= {"FlightGroup", "Result", "UnavailableError"}
    assert names["FlightGroup"] >= {
        "run", "run_sync", "coalesce", "forget", "stats", "close", "aclose", "closed",
    }
    assert names["FlightTimeoutError"] >= {"key", "deadline", "attempts", "max_deadline_threads"}
    assert names["Stats"] >= {"calls", "joiners_p99", "local_flights"}
    assert names["Retry"] >= {"attempts", "on", "on_timeout"}
    assert names["a decorated function"] == {"forget", "flight_namespace", "options"}


def test_a_public_name_added_without_docs_is_named() -> None:
    """A new public name that the page does not state fails the check, by its name."""
    names = public_names()
    names["FlightGroup"] = names["FlightGroup"] | {"run_later"}
    assert missing(names, API_DOC.read_text()) == {"FlightGroup": ["run_later"]}


def test_a_name_only_in_an_example_is_not_stated() -> None:
    """A name that appears only in a fenced example does not count as documented."""
    page = "```python\ng.run_later(key)\n```\n`run` leads or joins.\n"
    assert missing({"FlightGroup": {"run", "run_later"}}, page) == {"FlightGroup": ["run_later"]}


def test_no_file_refers_to_a_contract_outside_the_repository() -> None:
    """No source, doc, test or script names the contract file that a clone lacks."""
    found = []
    places = [ROOT / "src", ROOT / "docs", ROOT / "tests", ROOT / "scripts", ROOT / "benchmarks"]
    files = [README, ROOT / "pyproject.toml"]
    for place in places:
        files += [path for path in place.rglob("*") if path.is_file()]
    for path in files:
        if path.suffix not in {".py", ".md", ".toml", ".txt", ".cfg", ""}:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [
            f"{path.relative_to(ROOT)}:{number}"
            for number, line in enumerate(text.splitlines(), 1)
            if OUTSIDE_CONTRACT in line
        ]
    assert not found, f"these lines name {OUTSIDE_CONTRACT}, use docs/api.md: {found}"


def test_readme_links_the_contract_and_the_glossary() -> None:
    """The README leads a newcomer to docs/api.md and docs/glossary.md."""
    text = README.read_text()
    assert "(docs/api.md)" in text
    assert "(docs/glossary.md)" in text


def test_dense_pages_open_with_a_link_to_the_glossary() -> None:
    """The pages that use the project's words heavily point to the glossary at their top."""
    for page in ("process-scope", "directory-scope", "fleet-protocol", "failures", "api"):
        head = "\n".join((ROOT / "docs" / f"{page}.md").read_text().splitlines()[:12])
        assert "glossary.md" in head, page


def test_relative_links_of_the_entry_pages_exist() -> None:
    """Every relative link of the README, docs/api.md and docs/glossary.md names a file."""
    broken = []
    for page in (README, API_DOC, GLOSSARY):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
