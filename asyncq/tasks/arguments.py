"""A task's arguments and result as stored: checked against the function's annotations with pydantic v2, kept in
the job's body as JSON (``{"task": name, "args": {parameter: value}}``), and checked again before the call.

Every parameter is stored by name with its default applied, so that the same call written with or without a
default value is the same job (same key, same body: a no-op). Models, dataclasses, ``datetime``, ``UUID``,
``Decimal``, enums and plain JSON values round-trip: dumped in pydantic's JSON mode, validated back in its lax
mode. Unannotated parameters are ``Any`` (any JSON value).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

from pydantic import TypeAdapter, ValidationError

from asyncq.errors import InvalidArguments

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


class Arguments:
    """How one task's calls are checked, stored and rebuilt. Annotations are resolved on first use, so a task
    may name a type defined below it in its module."""

    def __init__(self, task: str, function: Callable[..., Any]) -> None:
        self.task = task
        self.function = function
        self.signature = inspect.signature(function)
        for parameter in self.signature.parameters.values():
            if parameter.kind in _VARIADIC:
                raise TypeError(f"task {task}: *args and **kwargs cannot be stored as named arguments")

    @cached_property
    def _adapters(self) -> dict[str, TypeAdapter[Any]]:
        hints = typing.get_type_hints(self.function, include_extras=True)
        return {name: TypeAdapter(hints.get(name, Any)) for name in self.signature.parameters}

    @cached_property
    def returns(self) -> TypeAdapter[Any]:
        """The return annotation's adapter (``Any`` when there is none)."""
        return TypeAdapter(typing.get_type_hints(self.function, include_extras=True).get("return", Any))

    def dump(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The stored form of a call: every parameter by name, as JSON values; ``InvalidArguments`` naming each
        bad or missing field."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise InvalidArguments(self.task, [("arguments", str(error))]) from None
        bound.apply_defaults()
        return self.dump_values(bound.arguments)

    def dump_values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Some parameters' values in their stored form (``assert_enqueued`` compares these)."""
        stored: dict[str, Any] = {}
        problems: list[tuple[str, str]] = []
        for name, value in values.items():
            adapter = self._adapter(name, problems)
            if adapter is None:
                continue
            try:
                stored[name] = adapter.dump_python(adapter.validate_python(value), mode="json")
            except ValidationError as error:
                problems.extend(_problems(name, error))
            except ValueError as error:  # pydantic's serialisation errors (a value JSON cannot hold)
                problems.append((name, str(error)))
        if problems:
            raise InvalidArguments(self.task, problems)
        return stored

    def load(self, stored: object) -> tuple[list[Any], dict[str, Any]]:
        """The call rebuilt from a job's stored arguments, validated again: ``(args, kwargs)``;
        ``InvalidArguments`` if the job no longer fits the function (written by another version of it)."""
        if not isinstance(stored, dict):
            raise InvalidArguments(self.task, [("args", f"must be an object, not {type(stored).__name__}")])
        problems = [(name, "unexpected argument") for name in stored if name not in self.signature.parameters]
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for name, parameter in self.signature.parameters.items():
            if name not in stored:
                if parameter.default is inspect.Parameter.empty:
                    problems.append((name, "missing"))
                    continue
                value = parameter.default
            else:
                try:
                    value = self._adapters[name].validate_python(stored[name])
                except ValidationError as error:
                    problems.extend(_problems(name, error))
                    continue
            if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
                args.append(value)
            else:
                kwargs[name] = value
        if problems:
            raise InvalidArguments(self.task, problems)
        return args, kwargs

    def _adapter(self, name: str, problems: list[tuple[str, str]]) -> TypeAdapter[Any] | None:
        adapter = self._adapters.get(name)
        if adapter is None:
            problems.append((name, "no such parameter"))
        return adapter


def _problems(name: str, error: ValidationError) -> list[tuple[str, str]]:
    """Each of pydantic's errors as ``(field path, message)``, with the input it refused."""
    found = []
    for item in error.errors(include_url=False):
        path = ".".join([name, *(str(part) for part in item["loc"])])
        found.append((path, f"{item['msg']} (got {item.get('input')!r:.80})"))
    return found
