"""A griffe extension: Sphinx cross-reference roles in docstrings become mkdocstrings links.

The docstrings are Google style with Sphinx roles for cross-references (``:class:`Translator```,
``:func:`~transduce.model.load_model```, ``:mod:`.search```). mkdocstrings does not read roles,
and no published griffe extension does (checked the package index for one), so this one turns
each into an optional autorefs link: a link where the target is rendered somewhere on the site,
the name as code where it is not, and never a warning (``mkdocs build --strict`` stays green).

Names are resolved as Python would from where the docstring stands: a dotted path is taken as it
is, a leading dot is relative to the module's package, and a bare name is looked up in the
object's scope, then its module's (imports included). ``~`` shows only the last component, as in
Sphinx. A paragraph's closing ``::`` (reStructuredText's literal-block marker) becomes ``:``.
Only the docs build uses this (``mkdocs.yml``); the source keeps its roles.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(?P<target>[^`]+)`")
# A paragraph ending in "::" introduces an indented literal block in reStructuredText; Markdown
# already shows that block as code, so only the colon is kept, as Sphinx shows it.
LITERAL_MARKER = re.compile(r"(?<=\S)::(?=\n\s*\n)")


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                text = ROLE.sub(lambda m: _link(obj, m["target"]), obj.docstring.value)
                obj.docstring.value = LITERAL_MARKER.sub(":", text)


def _walk(obj: griffe.Object):
    """The object and its members, depth first; aliases (re-exports) are skipped: their targets
    are visited where they are defined."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


def _link(obj: griffe.Object, target: str) -> str:
    """An optional autorefs link to ``target`` as seen from ``obj``; the name as code if unknown."""
    short = target.startswith("~")
    target = target.lstrip("~!").removesuffix("()")
    title = target.rsplit(".", 1)[-1] if short else target
    path = _resolve(obj, target)
    code = f"<code>{title}</code>"
    return f'<autoref identifier="{path}" optional>{code}</autoref>' if path else code


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """The full dotted path ``target`` names from ``obj``'s scope, or None."""
    if target.startswith("."):
        module = obj.module
        package = module if module.is_init_module else module.parent
        dots = len(target) - len(target.lstrip("."))
        for _ in range(dots - 1):
            package = package.parent if package is not None else None
        return f"{package.path}.{target.lstrip('.')}" if package is not None else None
    if target.startswith("transduce.") or target == "transduce":
        return target
    head, _, rest = target.partition(".")
    scope = obj if obj.is_class or obj.is_module else obj.parent
    try:
        path = scope.resolve(head)
    except (griffe.NameResolutionError, AttributeError):
        return None
    return f"{path}.{rest}" if rest else path
