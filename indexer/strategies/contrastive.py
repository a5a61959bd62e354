"""Contrastive Prompting, CP (methods.md §3): subtract what an "irrelevant information" prompt
puts into the attention output, then read the normal prompt's last token.

Per text: one auxiliary forward stops after the intervention layer l and yields B, the o_proj
input of layer l at its last token. Each normal prompt's forward then replaces its own last
token's o_proj input A at layer l by α·(A − B) (norm scaling, NS) or (A − B)·‖A‖/‖A − B‖ (norm
recovering, NR), and its last token is read at the output layer. Several normal prompts
(``cot+knowledge``, the paper's CK) share the one auxiliary pass; their readouts are averaged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from ragidx.indexer.errors import RagidxError
from ragidx.indexer.roles import ROLES, Role
from ragidx.indexer.strategies.base import PreparedText, Strategy, check_template
from ragidx.indexer.strategies.layers import resolve_layer
from ragidx.indexer.strategies.options import StrategyOptions, option
from ragidx.indexer.strategies.paper_models import LLAMA2_7B, LLAMA3_8B, is_model
from ragidx.indexer.strategies.pooling import last_real_token
from ragidx.indexer.strategies.prompts import NORMAL_PROMPTS

if TYPE_CHECKING:
    import torch

    from ragidx.indexer.ingest.spans import Span
    from ragidx.indexer.model.runtime import Batch, ModelRuntime

AUXILIARY_TEMPLATE = 'The irrelevant information of this sentence : "{text}" means in one word:"'
Mode = Literal["ns", "nr"]
# (intervention layer, alpha, output layer) from the authors' code for the models it names.
PAPER_SETTINGS = (("Llama-2-7B", LLAMA2_7B, (4, 0.5, 26)), ("Llama-3-8B", LLAMA3_8B, (6, 0.25, 30)))
DEFAULT_ALPHA = 0.5


def default_settings(config: Any) -> tuple[tuple[int, float, int], str]:
    """The code's settings for Llama-2-7B and Llama-3-8B; else l = round(0.14·L), α = 0.5,
    output = round(0.84·L) − 1."""
    for name, fingerprint, settings in PAPER_SETTINGS:
        if is_model(config, fingerprint):
            return settings, f"paper code ({name})"
    layers = config.num_hidden_layers
    settings = (round(0.14 * layers), DEFAULT_ALPHA, max(round(0.84 * layers) - 1, 0))
    return settings, "relative depth (l = round(0.14·L), output = round(0.84·L) - 1)"


def intervene(a: torch.Tensor, b: torch.Tensor, mode: str, alpha: float) -> torch.Tensor:
    """NS: α·(A − B); NR: (A − B) rescaled to A's norm."""
    delta = a - b
    if mode == "ns":
        return alpha * delta
    return delta * a.norm(dim=-1, keepdim=True) / delta.norm(dim=-1, keepdim=True).clamp(min=1e-12)


@dataclass(frozen=True)
class PromptSet(PreparedText):
    """``ids`` is the first normal prompt; ``normals`` all of them; ``auxiliary`` the contrast prompt."""

    normals: list[list[int]]
    auxiliary: list[int]


class ContrastivePrompting(Strategy):
    name = "cp"
    description = "Contrastive Prompting: normal prompt minus an 'irrelevant information' prompt at layer l"
    paper = "Contrastive Prompting (CP), Cheng et al. 2025"
    preprocess_text = True

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        prompt: str = option(
            "prompteol|cot|knowledge or a '+'-joined set such as cot+knowledge.", "prompteol"
        )
        aux_prompt: str | None = option("Auxiliary template ({text} slot).")
        cp_layer: int | None = option("Intervention layer l.")
        cp_mode: Mode = option("Norm scaling or recovering.", "ns")
        cp_alpha: float | None = option("Scaling factor of ns.")
        output_layer: int | None = option("Layer whose last token is read.")
        # Role -> one template per prompt: how an index restores a set (stored, never a flag).
        normal_templates: dict[str, list[str]] | None = option(None)

    options: Options

    def __init__(
        self,
        runtime: ModelRuntime,
        options: Options | None = None,
        *,
        document_template: str | None = None,
        query_template: str | None = None,
        **common: Any,
    ):
        """``document_template``/``query_template`` customise a single prompt."""
        options = options or self.Options()
        templates = self.normal_templates(options, document_template, query_template)
        super().__init__(
            runtime,
            options,
            document_template=templates["document"][0],
            query_template=templates["query"][0],
            **common,
        )
        (layer, alpha, output), self.settings_source = default_settings(runtime.model.config)
        num_layers = runtime.arch.num_layers
        given = options.cp_layer, options.output_layer
        self.cp_layer = resolve_layer(layer if given[0] is None else given[0], num_layers, "--cp-layer")
        self.output_layer = resolve_layer(
            output if given[1] is None else given[1], num_layers, "--output-layer"
        )
        if self.output_layer < self.cp_layer:
            raise RagidxError(
                f"--output-layer {self.output_layer} comes before the intervention layer {self.cp_layer}"
            )
        self.templates = templates  # role -> one template per prompt of the set
        self.aux_prompt = check_template(options.aux_prompt or AUXILIARY_TEMPLATE, "--aux-prompt")
        self.cp_alpha = float(alpha if options.cp_alpha is None else options.cp_alpha)

    def resolved_options(self) -> dict[str, Any]:
        return {
            **super().resolved_options(),
            "normal_templates": self.templates,
            "aux_prompt": self.aux_prompt,
            "cp_layer": self.cp_layer,
            "output_layer": self.output_layer,
            "cp_alpha": self.cp_alpha,
        }

    @staticmethod
    def normal_templates(
        options: Options, document_template: str | None, query_template: str | None
    ) -> dict[str, list[str]]:
        """Role -> one checked template per prompt of ``options.prompt``: the stored set, else the
        prompts' own templates (or the one given template of a single prompt)."""
        names = options.prompt.split("+")
        unknown = [name for name in names if name not in NORMAL_PROMPTS]
        if unknown or len(set(names)) != len(names):
            raise RagidxError(
                f"--prompt {options.prompt!r}: use {', '.join(NORMAL_PROMPTS)} "
                "or a '+'-joined set such as cot+knowledge"
            )
        templates = options.normal_templates
        if templates is None:
            if len(names) > 1 and (document_template or query_template):
                raise RagidxError("--document-template/--query-template need a single --prompt, not a set")
            templates = {
                "document": [document_template or NORMAL_PROMPTS[name] for name in names],
                "query": [query_template or NORMAL_PROMPTS[name] for name in names],
            }
        if sorted(templates) != sorted(ROLES) or any(len(t) != len(names) for t in templates.values()):
            raise RagidxError(
                f"normal_templates needs one template per prompt of {options.prompt!r} for each role"
            )
        return {role: [check_template(t, "normal template") for t in templates[role]] for role in ROLES}

    @property
    def notes(self) -> dict[str, Any]:
        return {
            "settings_source": self.settings_source,
            "layers_per_text": f"{self.cp_layer + 1} (auxiliary) + "
            f"{len(self.templates['document'])} x {self.output_layer + 1} (normal)",
        }

    def prepare(
        self, texts: Sequence[str], role: Role, sentences: Sequence[Sequence[Span]] | None
    ) -> list[PreparedText]:
        prepared: list[PreparedText] = []
        for text in texts:
            before = self.truncated
            normals = [self.templated_ids(text, template) for template in self.templates[role]]
            auxiliary = self.templated_ids(text, self.aux_prompt)
            self.truncated = before + (self.truncated > before)  # count texts, not prompts
            prepared.append(PromptSet(normals[0], normals, auxiliary))
        return prepared

    def o_proj(self) -> torch.nn.Module:
        return cast("torch.nn.Module", self.runtime.arch.attention(self.cp_layer).o_proj)

    def auxiliary_vectors(self, batch: Batch) -> torch.Tensor:
        """B: the auxiliary prompt's o_proj input at layer l, last real token; layers past l never run."""
        with self.runtime.capture(self.o_proj(), lambda x: last_real_token(x, batch), inputs=True) as seen:
            self.runtime.forward(batch, stop_after=self.cp_layer)
        return seen[0]

    def contrasted_readout(self, batch: Batch, auxiliary: torch.Tensor) -> torch.Tensor:
        import torch

        rows = torch.arange(len(batch.indices), device=batch.input_ids.device)
        last = batch.last_positions

        def replace(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            states = args[0].clone()
            original = states[rows, last]
            states[rows, last] = intervene(
                original, auxiliary.to(original.dtype), self.options.cp_mode, self.cp_alpha
            )
            return (states, *args[1:])

        layer = self.runtime.arch.layers[self.output_layer]
        with contextlib.ExitStack() as stack:
            stack.callback(self.o_proj().register_forward_pre_hook(replace).remove)
            seen = stack.enter_context(
                self.runtime.capture(layer, lambda states: last_real_token(states, batch))
            )
            self.runtime.forward(batch, stop_after=self.output_layer)
        return seen[0]

    def readout(self, batch: Batch, rows: Sequence[PreparedText]) -> torch.Tensor:
        import torch

        sets: list[PromptSet] = list(rows)  # type: ignore[arg-type]
        auxiliary = self.auxiliary_vectors(self.runtime.pad([r.auxiliary for r in sets], batch.indices))
        readings = [self.contrasted_readout(batch, auxiliary)]
        for k in range(1, len(sets[0].normals)):
            readings.append(
                self.contrasted_readout(
                    self.runtime.pad([r.normals[k] for r in sets], batch.indices), auxiliary
                )
            )
        return torch.stack(readings).mean(dim=0)
