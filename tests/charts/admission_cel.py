"""A rendered ValidatingAdmissionPolicy, evaluated the way the API server does.

Match conditions first, then variables (each evaluated on first use; one that fails is CEL's
error value, which ``||`` absorbs), then every validation: a false result or an evaluation
error denies (``failurePolicy: Fail``), with the ``messageExpression`` text, or ``message`` when
that expression fails or yields an empty or multi-line string.

Two independent CEL implementations run the same policy: ``cel-python`` (pure Python) and
``cel-expr-python`` (Google's C++ runtime, with type checking). The tests require both to agree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import celpy

Manifest = dict[str, Any]
GROUPS = {
    "jobs": ("batch", "v1"),
    "cronjobs": ("batch", "v1"),
    "pods": ("", "v1"),
    "configmaps": ("", "v1"),
    "secrets": ("", "v1"),
}


def admission_request(user: str, resource: str, operation: str | None = None) -> dict[str, Any]:
    """The ``request`` variable of ``user``'s request on ``resource``.

    A plain resource is a CREATE (unless ``operation`` says otherwise); ``pods/exec`` and the
    like a CONNECT to that subresource.
    """
    name, _, sub = resource.partition("/")
    group, version = GROUPS[name]
    return {
        "operation": operation or ("CONNECT" if sub else "CREATE"),
        "userInfo": {"username": user},
        "resource": {"group": group, "version": version, "resource": name},
        "subResource": sub,
    }


class Policy(ABC):
    """One policy's compiled expressions and the API server's evaluation order."""

    def __init__(self, doc: dict[str, Any], *, launcher: str) -> None:
        self.launcher = launcher  # the user reviews come from unless told otherwise
        spec = doc["spec"]
        self.match = [self.compile(m["expression"]) for m in spec.get("matchConditions", [])]
        self.variables = {v["name"]: self.compile(v["expression"]) for v in spec["variables"]}
        self.validations = [
            (
                self.compile(v["expression"]),
                self.compile(v["messageExpression"]) if "messageExpression" in v else None,
                v["message"],
            )
            for v in spec["validations"]
        ]
        self.fallbacks: list[str] = []  # of the last review: messageExpressions that failed

    @abstractmethod
    def compile(self, text: str) -> Any:
        """Parse (and where the implementation can, type-check) one expression."""

    @abstractmethod
    def bind(self, obj: Manifest, request: dict[str, Any]) -> Any:
        """An activation holding ``object``, ``request`` and lazily the ``variables``."""

    @abstractmethod
    def evaluate(self, program: Any, activation: Any) -> tuple[bool, Any]:
        """(True, value), or (False, error) when the expression failed."""

    def review(
        self,
        obj: Manifest,
        *,
        user: str | None = None,
        resource: str = "jobs",
        operation: str | None = None,
    ) -> list[str]:
        """The messages of the failed validations; [] means admitted (or not matched)."""
        self.fallbacks = []
        request = admission_request(user or self.launcher, resource, operation)
        activation = self.bind(obj, request)
        for condition in self.match:
            ok, value = self.evaluate(condition, activation)
            if not ok:
                raise AssertionError(f"a match condition failed to evaluate: {value}")
            if not value:
                return []
        failed = []
        for program, message_program, message in self.validations:
            ok, value = self.evaluate(program, activation)
            if ok and value is True:
                continue
            if message_program is not None:
                ok, text = self.evaluate(message_program, activation)
                if ok and isinstance(text, str) and text and "\n" not in text:
                    failed.append(str(text))
                    continue
                self.fallbacks.append(f"{message} ({text!r})")
            failed.append(message)
        return failed


class _LazyVariables(celpy.celtypes.MapType):
    """cel-python's ``variables``: each evaluated on first use, an error kept as a value."""

    def __init__(self, programs: dict[str, Any], activation: dict[str, Any]) -> None:
        super().__init__({celpy.celtypes.StringType(n): None for n in programs})
        self._programs = programs
        self._activation = activation
        self._values: dict[str, Any] = {}

    def __getitem__(self, key: Any) -> Any:
        name = str(key)
        if name not in self._programs:
            raise KeyError(key)
        if name not in self._values:
            try:
                self._values[name] = self._programs[name].evaluate(self._activation)
            except celpy.CELEvalError as exc:
                self._values[name] = exc
        return self._values[name]


class PythonPolicy(Policy):
    """The policy under ``cel-python``."""

    def __init__(self, doc: dict[str, Any], *, launcher: str) -> None:
        self.env = celpy.Environment()
        super().__init__(doc, launcher=launcher)

    def compile(self, text: str) -> Any:
        return self.env.program(self.env.compile(text))

    def bind(self, obj: Manifest, request: dict[str, Any]) -> Any:
        activation: dict[str, Any] = {
            "object": celpy.json_to_cel(obj),
            "request": celpy.json_to_cel(request),
        }
        activation["variables"] = _LazyVariables(self.variables, activation)
        return activation

    def evaluate(self, program: Any, activation: Any) -> tuple[bool, Any]:
        try:
            value = program.evaluate(activation)
        except celpy.CELEvalError as exc:
            return False, exc
        if isinstance(value, Exception):
            return False, value
        if isinstance(value, celpy.celtypes.BoolType):
            return True, bool(value)
        return True, value


class CppPolicy(Policy):
    """The policy under Google's C++ CEL runtime (``cel-expr-python``), type-checked.

    ``object`` and ``request`` are declared ``dyn`` (the API server types them per matched
    kind; this policy matches every kind), ``variables`` a ``map(string, dyn)``. Variables
    are evaluated in order; one that fails is left out, so using it is an error, as in the
    API server.
    """

    def __init__(self, doc: dict[str, Any], *, launcher: str) -> None:
        from cel_expr_python import cel  # no wheel for every platform: imported on use

        self.cel = cel
        self.env = cel.NewEnv(
            variables={
                "object": cel.Type.DYN,
                "request": cel.Type.DYN,
                "variables": cel.Type.Map(cel.Type.STRING, cel.Type.DYN),
            }
        )
        super().__init__(doc, launcher=launcher)

    def compile(self, text: str) -> Any:
        return self.env.compile(text)

    def bind(self, obj: Manifest, request: dict[str, Any]) -> Any:
        data: dict[str, Any] = {"object": obj, "request": request, "variables": {}}
        for name, program in self.variables.items():
            ok, value = self.evaluate(program, data)
            if ok:
                data["variables"] = {**data["variables"], name: value}
        return data

    def evaluate(self, program: Any, activation: Any) -> tuple[bool, Any]:
        value = program.eval(data=activation)
        if value.type() == self.cel.Type.ERROR:
            return False, value.plain_value()
        return True, value.plain_value()
