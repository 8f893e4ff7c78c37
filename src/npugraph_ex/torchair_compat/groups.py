"""TorchAir's ``CompilerConfig``: a tree of option groups, turned into flat options.

Code written for TorchAir keeps its spelling and its reads::

    config = CompilerConfig()
    config.debug.aclgraph.disable_mempool_reuse_in_same_fx = True
    config.debug.aclgraph.disable_mempool_reuse_in_same_fx.value      # "1", as in TorchAir
    config.to_options()               # {"reuse_graph_pool_in_same_fx": False}

Every level rejects names it does not know, on set and on get, so a misspelt option fails where
it is written instead of being silently ignored. Assigning checks TorchAir's cheap rules (its
enumerated choices, int ranges, types); :meth:`CompilerConfig.to_config` validates the flat
options, as :func:`~npugraph_ex.torchair_compat.get_npu_backend` does.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterator
from typing import Any

from npugraph_ex.config import Config
from npugraph_ex.errors import ConfigError
from npugraph_ex.torchair_compat.fields import FLAT_NAMES, TREE, Field, Tree
from npugraph_ex.torchair_compat.values import OptionValue

__all__ = ["CompilerConfig", "OptionGroup"]

INTERNAL = frozenset({"_path", "_spec", "_options", "_groups"})
CUSTOM_PASSES = ("post_grad_custom_pre_pass", "post_grad_custom_post_pass")


class OptionGroup:
    """One level of TorchAir's nested config; unknown names raise AttributeError."""

    __slots__ = ("_groups", "_options", "_path", "_spec")

    def __init__(self, path: str, spec: Tree) -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_spec", spec)
        options = {
            name: OptionValue(f"{path}.{name}", field.kind, field.default)
            for name, field in spec.items()
            if isinstance(field, Field)
        }
        groups = {
            name: OptionGroup(f"{path}.{name}", sub)
            for name, sub in spec.items()
            if not isinstance(sub, Field)
        }
        object.__setattr__(self, "_options", options)
        object.__setattr__(self, "_groups", groups)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails; internal slots missing means a half-built
        # object (copy, pickle), which must not recurse into the lookups below.
        if name in INTERNAL:
            raise AttributeError(name)
        if name in self._groups:
            return self._groups[name]
        option = self._options.get(name)
        if option is None:
            raise self._unknown(name)
        return option if self._spec[name].kind.wrapped else option._value

    def __setattr__(self, name: str, value: Any) -> None:
        if name in INTERNAL:  # copy and pickle restore the slots through setattr
            object.__setattr__(self, name, value)
            return
        if name in self._groups:
            raise AttributeError(
                f"{self._path}.{name} is a group of options and cannot be assigned; set its "
                f"fields instead, e.g. {self._path}.{name}.{next(iter(self._spec[name]))}"
            )
        option = self._options.get(name)
        if option is None:
            raise self._unknown(name)
        option.value = value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._spec))

    def __repr__(self) -> str:
        items = ", ".join(f"{name}={value!r}" for name, _, value in self.set_fields())
        return f"{type(self).__name__}({items})"

    def _unknown(self, name: str) -> AttributeError:
        valid = sorted(self._spec)
        message = f"{self._path} has no option {name!r}"
        close = difflib.get_close_matches(name, valid, n=1)
        message += f"; did you mean {close[0]!r}?" if close else "."
        return AttributeError(f"{message} Valid names here: {', '.join(valid)}")

    def fields(self, prefix: str = "") -> Iterator[tuple[str, Field, OptionValue]]:
        """Yield (dotted TorchAir name, field, its option) for every field of this group."""
        for name, sub in self._spec.items():
            if isinstance(sub, Field):
                yield prefix + name, sub, self._options[name]
            else:
                yield from self._groups[name].fields(f"{prefix}{name}.")

    def set_fields(self) -> Iterator[tuple[str, Field, Any]]:
        """Yield (dotted TorchAir name, field, value) for every field that was assigned."""
        for spelling, field, option in self.fields():
            if option.is_set:
                yield spelling, field, option._value

    def as_dict(self, mode: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """TorchAir's ``(local options, global options)``: each option of this group and the
        groups below that holds a value, by its name, as ``.value`` reads it. TorchAir's
        graph-engine keys (``ge.*``) have no counterpart here; the global dict stays empty."""
        local: dict[str, Any] = {}
        for name, sub in self._spec.items():
            if not isinstance(sub, Field):
                local.update(self._groups[name].as_dict(mode)[0])
            elif sub.kind.wrapped and self._options[name].value is not None:
                local[name] = self._options[name].value
        return local, {}

    def copy_values_from(self, other: OptionGroup) -> None:
        for name, option in self._options.items():
            source = other._options[name]
            option._value, option.is_set = source._value, source.is_set
        for name, group in self._groups.items():
            group.copy_values_from(other._groups[name])


class CompilerConfig(OptionGroup):
    """TorchAir's ``CompilerConfig``, turned into npugraph_ex options by :meth:`to_options`."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("CompilerConfig()", TREE)

    def __eq__(self, other: object) -> bool:
        """Equal when every field holds the same value, as TorchAir compares configs."""
        if not isinstance(other, CompilerConfig):
            return NotImplemented
        mine = [(name, option._value) for name, _, option in self.fields()]
        theirs = [(name, option._value) for name, _, option in other.fields()]
        return mine == theirs

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        # The tree's checks are closures, which pickle cannot store: store the values only.
        values = [(spelling, option._value, option.is_set) for spelling, _, option in self.fields()]
        return restore, (values,)

    def copy(self) -> CompilerConfig:
        """A config with the same values (the values themselves are shared, not copied)."""
        clone = CompilerConfig()
        clone.copy_values_from(self)
        return clone

    def as_dict(self, mode: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """TorchAir's ``as_dict()``; the flat npugraph_ex names appear where they were set, and
        the custom passes never (TorchAir leaves them out too)."""
        local: dict[str, Any] = {}
        for group in self._groups.values():
            local.update(group.as_dict(mode)[0])
        for name, option in self._options.items():
            if name in CUSTOM_PASSES or (name in FLAT_NAMES and not option.is_set):
                continue
            if self._spec[name].kind.wrapped and option.value is not None:
                local[name] = option.value
        return local, {}

    def to_options(self) -> dict[str, Any]:
        """Return the flat options for the fields that were set."""
        return self._collect()[0]

    def to_config(self) -> Config:
        """Return the validated Config; raises ConfigError naming the TorchAir spelling."""
        options, spellings = self._collect()
        try:
            return Config.from_options(options)
        except ConfigError as e:
            spelling = spellings.get(e.option or "")
            if spelling is not None and sys.version_info >= (3, 11):
                e.add_note(f"(set as CompilerConfig().{spelling})")
            raise

    def unused_fields(self) -> list[str]:
        """``name=value`` (with why, where it helps) for each field set to a value that means
        nothing here."""
        unused = []
        for spelling, field, value in self.set_fields():
            if field.is_unused(value):
                note = f" ({field.note})" if field.note else ""
                unused.append(f"{spelling}={value!r}{note}")
        return unused

    def reading(self, config: Config) -> CompilerConfig:
        """A copy whose fields read what ``config`` holds: what a custom pass is given, so that
        it sees the options in effect (``torch.compile(options=...)`` included)."""
        view = self.copy()
        for _, field, option in view.fields():
            if field.reads is not None:
                option._value = field.reads(config)
        return view

    def _collect(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Return (flat options, flat option name -> TorchAir spelling that set it)."""
        options: dict[str, Any] = {}
        spellings: dict[str, str] = {}
        fills: list[tuple[str, dict[str, Any]]] = []
        for spelling, field, value in self.set_fields():
            if field.sets is None:
                continue
            if field.fills:
                fills.append((spelling, field.sets(value)))
                continue
            for option, mapped in field.sets(value).items():
                if option in options and options[option] != mapped:
                    raise ConfigError(
                        f"CompilerConfig().{spelling} conflicts with "
                        f"CompilerConfig().{spellings[option]}: both set option "
                        f"{option!r}, to different values; set only one of them",
                        option=option,
                    )
                options[option] = mapped
                spellings[option] = spelling
        for spelling, mapped_options in fills:
            for option, mapped in mapped_options.items():
                if option not in options:
                    options[option] = mapped
                    spellings[option] = spelling
        return options, spellings


def restore(values: list[tuple[str, Any, bool]]) -> CompilerConfig:
    """The CompilerConfig whose fields hold ``values`` (``CompilerConfig.__reduce__``)."""
    config = CompilerConfig()
    options = {spelling: option for spelling, _, option in config.fields()}
    for spelling, value, is_set in values:
        options[spelling]._value, options[spelling].is_set = value, is_set
    return config
