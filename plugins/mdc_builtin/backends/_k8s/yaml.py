"""The Kubernetes backends' YAML writer: libyaml's emitter (PyYAML's C extension) with fixed
key order, block style, scripts as literal blocks, and every value reading back as given.

PyYAML quotes a string its own (YAML 1.1) resolver would read as another type. One resolver
is added that matches every plain scalar a YAML 1.1 reader (kubectl's go-yaml: ``yes``,
``on``, ``12:30``, ``0b1``) or a YAML 1.2 reader (``0o17``, ``1e3``, ``.5e3``) resolves to
something other than a string, so libyaml quotes those too.

libyaml is used rather than a writer of mdc's own: on the goldens a hand-written writer was
about 0.4 ms a file faster (0.61 against 1.00 ms of CPU), too little to keep one. PyYAML is
imported on the first write. validate and explain write no files (``mdc.api.files.files_written``
is False): documents :func:`plainly_writable` holds writable are not written then, and any
others are, so the writer's refusals (a float value) stay checks of every command.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml

#: a plain scalar that a YAML 1.1 reader (PyYAML; kubectl's go-yaml) or a YAML 1.2 reader
#: resolves to something other than a string: the 1.1 type repository's implicit bool, null,
#: int, float, timestamp, merge and value forms and the 1.2 core schema's (both allow "_"
#: in numbers here, as PyYAML and ruamel read them); matched from the start, as PyYAML does;
#: compiled with the writer, which validate does not build
_NOT_A_STRING = r"""(?:
    ~ | null | Null | NULL
  | y | Y | yes | Yes | YES | n | N | no | No | NO | on | On | ON | off | Off | OFF  # 1.1
  | true | True | TRUE | false | False | FALSE
  | [-+]?0b[01_]+ | [-+]?0o?[0-7_]+ | [-+]?0x[0-9a-fA-F_]+       # 0b1, 017 (1.1), 0o17 (1.2), 0x1f
  | [-+]?[0-9][0-9_]* | [-+][0-9_]+                              # 12, 1_000
  | [-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+                           # base 60 (1.1): 12:30
  | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])*\.[0-9_]*(?:[eE][-+]?[0-9]+)?  # 1.5, 1.e3, 12:30.5
  | [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+                             # 1e3 (1.2)
  | [-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?                           # .5, .5e3
  | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN)
  | [0-9]{4}-[0-9]{2}-[0-9]{2}                                   # timestamp: a date
  | [0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]*)?
    (?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?               # ... or a date and time
  | << | =                                                       # merge, value
)\Z"""


#: the line breaks besides line feed (NEL, LS, PS): readers fold them unless escaped
_OTHER_BREAKS = re.compile("[\x85\u2028\u2029]")


def _string(dumper: Any, text: str) -> yaml.Node:
    # A literal block where libyaml can write one that reads back exactly (it falls back to
    # double quotes itself: trailing spaces, control characters); the other line breaks are
    # escaped in double quotes, where every reader keeps them.
    style = '"' if _OTHER_BREAKS.search(text) else "|" if "\n" in text else None
    node: yaml.Node = dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)
    return node


def _mapping(dumper: Any, mapping: Mapping[Any, Any]) -> yaml.Node:
    # Kubernetes keys are strings: any other key is written as its str(), the last value
    # for equal keys winning where the first stood.
    if not all(type(key) is str for key in mapping):
        mapping = {str(key): value for key, value in mapping.items()}
    node: yaml.Node = dumper.represent_mapping("tag:yaml.org,2002:map", mapping.items())
    return node


def _sequence(dumper: Any, items: tuple[Any, ...]) -> yaml.Node:
    node: yaml.Node = dumper.represent_list(items)
    return node


def _refuse(dumper: Any, value: Any) -> yaml.Node:
    # No Kubernetes field mdc writes is a float: one here is a bug, not a value to round.
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML")


@functools.cache
def _dumper() -> type[Any]:
    import yaml

    class Dumper(yaml.CSafeDumper):
        """SafeDumper's rules on libyaml's emitter, with the representers above."""

        def ignore_aliases(self, data: Any) -> bool:
            return True  # a value used twice is written twice, never as an &anchor/*alias

    # A plain scalar _NOT_A_STRING matches is taken for a non-string, so libyaml quotes it.
    not_a_string = re.compile(_NOT_A_STRING, re.VERBOSE)
    Dumper.add_implicit_resolver("tag:mdc,2026:not-a-string", not_a_string, None)
    Dumper.add_representer(str, _string)
    Dumper.add_representer(dict, _mapping)
    Dumper.add_multi_representer(dict, _mapping)  # OrderedDict and other dict types
    Dumper.add_representer(tuple, _sequence)
    Dumper.add_representer(float, _refuse)
    return Dumper


def dump_yaml(docs: Sequence[Mapping[str, Any]]) -> str:
    """Documents as one multi-document YAML text, deterministic, every value reading back as given.

    Keys keep the insertion order of the dicts (build them apiVersion, kind,
    metadata, spec); strings that look like numbers, booleans or null are quoted.
    """
    import yaml

    return yaml.dump_all(
        [dict(doc) for doc in docs],
        Dumper=_dumper(),
        explicit_start=True,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=-1,  # never fold a long line
    )


#: values the writer writes as they are (exact types: a subclass may be refused)
_SCALARS = (str, int, bool, type(None))
#: more values than any manifest holds: a structure that contains itself
_TOO_MANY = 1_000_000


def plainly_writable(docs: Sequence[Mapping[str, Any]]) -> bool:
    """True only if :func:`dump_yaml` surely writes ``docs``: dicts, lists and tuples of
    ASCII strings, ints, booleans and None. False for anything else (a float, another
    type, other characters, a structure inside itself): only the writer judges those."""
    stack: list[Any] = list(docs)
    for _ in range(_TOO_MANY):
        if not stack:
            return True
        value = stack.pop()
        kind = type(value)
        if kind is dict:
            stack.extend(value)
            stack.extend(value.values())
        elif kind is list or kind is tuple:
            stack.extend(value)
        elif kind not in _SCALARS or (kind is str and not value.isascii()):
            return False
    return False


def load_yaml(text: str) -> list[Any]:
    """Parse back what :func:`dump_yaml` wrote (plain Python values)."""
    import yaml

    return [doc for doc in yaml.load_all(text, Loader=yaml.CSafeLoader) if doc is not None]
