"""The shared base of every config section: unknown keys refused, and the section that names a registered
component with that component's own parameters beside the choice (:class:`Chosen`)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    model_serializer,
    model_validator,
)

from hetfed.registry import ComponentParams, registry_of


class Strict(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def unread(self) -> dict[str, tuple[Any, str]]:
        """The keys of this section (dotted within it) set away from their default that it does not read given its
        other keys, each with why — a setting that would otherwise be silently ignored, which a note names
        (:func:`hetfed.config.unread_keys`). Here: its sections' own; a section with rules of its own adds them."""
        return {f"{name}.{key}": found for name in type(self).model_fields
                if isinstance(section := getattr(self, name), Strict) for key, found in section.unread().items()}

    def away_from_default(self, *names: str) -> dict[str, Any]:
        """Those of ``names`` set away from their default, with their values."""
        fields = type(self).model_fields
        return {k: getattr(self, k) for k in names
                if getattr(self, k) != fields[k].get_default(call_default_factory=True)}


class Chosen(Strict):
    """A section that names one registered component and carries that component's own parameters beside the
    choice: ``partition: {kind: dirichlet, alpha: 0.1}``.

    ``chosen_by`` = (kind of component, field that names one). The section's fields are what every component of
    the kind shares; any other key is the chosen component's, validated by the ``Params`` its file declares, so a
    key it does not have is refused with the keys it takes. :attr:`params` is the validated model; a dump writes
    it in full (every parameter, defaults filled), :func:`as_given` only what was given."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)
    chosen_by: ClassVar[tuple[str, str]]
    #: the top-level section is the methods' defaults (``model``): in a whole config, a key its own choice does not
    #: take is left for the methods whose choice does (refused when none does: :meth:`Config._methods_resolve`)
    for_methods: ClassVar[bool] = False
    _params: BaseModel = PrivateAttr(default_factory=ComponentParams)

    @model_validator(mode="after")
    def _component_params(self, info: ValidationInfo) -> Chosen:
        kind, field = self.chosen_by
        registry = registry_of(kind)  # the component's own declaration (discovered, not listed here)
        context = info.context or {}
        where = context.get("prefix", "") + registry.params_key  # a method's own: methods.0.model
        component = registry.get(getattr(self, field), f"{where}.{field}")
        given = self.model_extra or {}
        if self.for_methods and context.get("whole"):
            given = {k: v for k, v in given.items() if k in component.Params.model_fields}
        self._params = registry.params(getattr(self, field), given, where, type(self).model_fields)
        return self

    def not_taken(self) -> dict[str, Any]:
        """The given keys that this section's own choice does not take (a methods' default, ``for_methods``)."""
        takes = registry_of(self.chosen_by[0]).get(self.choice).Params.model_fields
        return {k: v for k, v in (self.model_extra or {}).items() if k not in takes}

    @model_serializer(mode="wrap")
    def _with_params(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        data = handler(self)
        if not (info.context or {}).get("as_given"):
            data.update(self._params.model_dump(mode=info.mode))
        return data

    @property
    def chooser(self) -> str:
        return self.chosen_by[1]

    @property
    def choice(self) -> str:
        return str(getattr(self, self.chosen_by[1]))

    @property
    def params(self) -> Any:
        """The chosen component's validated parameters (its ``Params`` model, frozen)."""
        return self._params

    def shown(self) -> dict[str, Any]:
        """The section as a message shows it: what differs from the defaults (``{'kind': 'qsgd', 'bits': 8}``)."""
        return self.model_dump(mode="json", exclude_defaults=True, context={"as_given": True})

    def given_for(self, name: str) -> dict[str, Any]:
        """This section as given, for a method that chooses component ``name`` instead: the shared keys, and the
        given parameters that ``name`` takes too (a top-level ``model.hidden`` reaches a method's ``cgau``, not
        its ``cnn4``)."""
        shared = {k: v for k, v in self.model_dump(mode="json", context={"as_given": True}).items()
                  if k in type(self).model_fields}
        component = registry_of(self.chosen_by[0]).find(name)  # not registered: refused by the method's validation,
        takes = component.Params.model_fields if component is not None else {}  # which names the method's own key
        return {**shared, **{k: v for k, v in (self.model_extra or {}).items() if k in takes}}
