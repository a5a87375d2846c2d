"""How a served prompt is put to a model: the template saved beside it (``fedtune_prompt.json``).

Stands alone (the standard library only): MLflow ships this file with every logged model
(``code_paths``, as ``fedtune_prompt_frame``) so that the serving code, which cannot import
fedtune, frames requests exactly as fedtune's training framed its examples.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Beside every saved model: how a bare instruction is put to it, the template its training
#: used (fedtune's Alpaca prompt without input), so served prompts read as trained ones did.
PROMPT_FILE = "fedtune_prompt.json"
#: The name this module travels under inside a logged model.
SHIPPED_NAME = "fedtune_prompt_frame.py"


def read_template(model_dir: Path) -> str | None:
    """The prompt template saved with the model in ``model_dir``, if any."""
    file = Path(model_dir) / PROMPT_FILE
    if not file.is_file():
        return None
    template = json.loads(file.read_text(encoding="utf-8")).get("template")
    return template if isinstance(template, str) and "{instruction}" in template else None


def framed(prompt: str, template: str | None) -> str:
    """``prompt`` as the instruction of ``template``; unchanged without one, or when the
    caller already sent a prompt in that template (its fixed opening)."""
    if template is None or prompt.startswith(template.split("{instruction}", 1)[0]):
        return prompt
    return template.replace("{instruction}", prompt)
