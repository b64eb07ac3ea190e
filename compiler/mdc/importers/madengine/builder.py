"""The mdc spec under construction from a madengine context: its values, the source map
pointing each at the madengine key it came from, and the report of what changed."""

from __future__ import annotations

from typing import Any

from mdc.errors import Diagnostic, Severity, join_pointer
from mdc.loaders import LoadedDocument, Position


def get_pointer(data: object, pointer: str) -> object:
    """The value at ``pointer`` in ``data`` (None if absent); tokens are plain keys here."""
    node = data
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def has_pointer(data: object, pointer: str) -> bool:
    head, _, last = pointer.rpartition("/")
    parent = get_pointer(data, head) if head else data
    return isinstance(parent, dict) and last.replace("~1", "/").replace("~0", "~") in parent


class Builder:
    """The mdc spec under construction, its source map, and the report."""

    def __init__(self, src: LoadedDocument) -> None:
        self.src = src
        self.data: dict[str, Any] = {}
        self.values: dict[str, Position] = {}
        self.keys: dict[str, Position] = {}
        self.notes: list[Diagnostic] = []
        self.errors: list[Diagnostic] = []
        #: source pointers that were carried over or reported (the rest are reported at the end)
        self.handled: set[str] = set()

    # source side
    def get(self, pointer: str) -> Any:
        return get_pointer(self.src.data, pointer)

    def has(self, pointer: str) -> bool:
        return has_pointer(self.src.data, pointer)

    def note(self, code: str, pointer: str, message: str, hint: str | None = None) -> None:
        self.handled.add(pointer)
        self.notes.append(
            Diagnostic(
                severity=Severity.WARNING,
                code=code,
                message=message,
                hint=hint,
                location=self.src.locate(pointer, key=True),
            )
        )

    def error(self, code: str, pointer: str, message: str, hint: str | None = None) -> None:
        self.errors.append(
            Diagnostic(
                severity=Severity.ERROR,
                code=code,
                message=message,
                hint=hint,
                location=self.src.locate(pointer, key=True),
            )
        )

    # target side
    def put(self, path: tuple[str, ...], value: Any, origin: str | None) -> None:
        """Set ``path`` in the spec to ``value``, located at the source pointer ``origin``."""
        node = self.data
        for token in path[:-1]:
            node = node.setdefault(token, {})
        node[path[-1]] = value
        if origin is not None:
            self.handled.add(origin)
            self._locate(join_pointer(path), value, origin)

    def _locate(self, pointer: str, value: Any, origin: str) -> None:
        if origin in self.src.values:
            self.values[pointer] = self.src.values[origin]
        if origin in self.src.keys:
            self.keys[pointer] = self.src.keys[origin]
        source = self.get(origin)
        if isinstance(value, dict) and isinstance(source, dict):
            for key, item in value.items():
                if key in source:
                    self._locate(
                        f"{pointer}/{escape_token(key)}", item, f"{origin}/{escape_token(key)}"
                    )
        elif isinstance(value, list) and isinstance(source, list) and len(value) == len(source):
            for index, item in enumerate(value):
                self._locate(f"{pointer}/{index}", item, f"{origin}/{index}")

    def locate_only(self, path: tuple[str | int, ...], origin: str) -> None:
        """Locate the spec value at ``path`` (already set) at the source pointer ``origin``."""
        self.handled.add(origin)
        self._locate(join_pointer(path), get_pointer(self.data, join_pointer(path)), origin)

    def table(self, path: tuple[str, ...], origin: str) -> None:
        """Locate the table at ``path`` at ``origin`` (a madengine block), unless it is."""
        pointer = join_pointer(path)
        if pointer not in self.values and origin in self.src.values:
            self.values[pointer] = self.src.values[origin]
            if origin in self.src.keys:
                self.keys[pointer] = self.src.keys[origin]

    def document(self) -> LoadedDocument:
        values = dict(self.values)
        if "" in self.src.values:
            values[""] = self.src.values[""]
        return LoadedDocument(path=self.src.path, data=self.data, values=values, keys=self.keys)


def escape_token(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def env_value(value: object) -> object:
    """madengine renders env values with Python's str(); mdc's [job] env holds strings."""
    if isinstance(value, bool | int | float):
        return str(value)
    return value
