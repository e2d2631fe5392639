"""A conversation's own settings: its system prompt and sampling (the Settings page's defaults
otherwise), with named presets to apply or save."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QInputDialog,
    QPlainTextEdit,
    QVBoxLayout,
)

from app import dialogs
from app.chat import presets
from app.settings import AppSettings
from app.widgets import Form, label, sampling_boxes, text_button

CHOOSE = "Apply a preset…"


class ChatOptionsDialog(QDialog):
    def __init__(self, saved: presets.Presets, defaults: AppSettings, options: dict, parent=None):
        """`options`: the conversation's own (system_prompt, sampling); `defaults`: the Settings page's."""
        super().__init__(parent)
        self.setWindowTitle("This chat's settings")
        self.setMinimumWidth(480)
        self.saved, self.defaults = saved, defaults
        column = QVBoxLayout(self)
        column.setSpacing(12)
        column.addWidget(label("These apply to this conversation only; the rest follow the defaults in Settings.",
                               "muted", wrap=True))
        self.system_prompt = QPlainTextEdit(options.get("system_prompt") or "")
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText(f"Empty: the default from Settings ({_short(defaults.system_prompt)})")
        self.system_prompt.setFixedHeight(90)
        column.addWidget(label("System prompt", "formLabel"))
        column.addWidget(self.system_prompt)
        self.fields = sampling_boxes().by_field()
        names = {"temperature": "Temperature", "top_p": "Top P", "top_k": "Top K", "min_p": "Min P",
                 "presence_penalty": "Presence penalty", "max_tokens": "Max reply tokens"}
        form = Form()
        for key, spin in self.fields.items():
            spin.setFixedWidth(130)
            form.addRow(names[key], spin)
        self.set_values(presets.apply_overrides(defaults, options.get("sampling", {})).__dict__)
        preset_row = QHBoxLayout()
        self.preset = QComboBox()
        self.preset.activated.connect(self._apply_preset)
        self.save_preset = text_button("Save as preset…")
        self.save_preset.clicked.connect(self._save_preset)
        self.delete_preset = text_button("Delete preset")
        self.delete_preset.clicked.connect(self._delete_preset)
        self.reset = text_button("Use the defaults")
        self.reset.setToolTip("Put back the sampling defaults from Settings")
        self.reset.clicked.connect(lambda: self.set_values(defaults.__dict__))
        preset_row.addWidget(self.preset, 1)
        preset_row.addWidget(self.save_preset)
        preset_row.addWidget(self.delete_preset)
        column.addWidget(label("Sampling", "formLabel"))
        column.addLayout(preset_row)
        column.addLayout(form)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.addButton(self.reset, QDialogButtonBox.ButtonRole.ResetRole)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        column.addWidget(buttons)
        self._fill_presets()

    def values(self) -> dict:
        return {key: spin.value() for key, spin in self.fields.items()}

    def set_values(self, values: dict) -> None:
        for key, spin in self.fields.items():
            if key in values:
                spin.setValue(values[key])

    def options(self) -> dict:
        """What the conversation keeps: its system prompt (absent: the default) and the sampling fields
        that differ from the defaults."""
        result: dict[str, object] = {}
        if self.system_prompt.toPlainText().strip():
            result["system_prompt"] = self.system_prompt.toPlainText()
        sampling = presets.overrides(self.values(), self.defaults)
        if sampling:
            result["sampling"] = sampling
        return result

    # ---- presets -------------------------------------------------------------------------------
    def _fill_presets(self, chosen: str = "") -> None:
        self.preset.clear()
        self.preset.addItem(CHOOSE)
        for name in self.saved.all():
            self.preset.addItem(name)
        self.preset.setCurrentText(chosen or CHOOSE)
        self._preset_chosen()

    def _preset_chosen(self) -> None:
        name = self.preset.currentText()
        self.delete_preset.setEnabled(name != CHOOSE and name not in presets.BUILT_IN)
        self.delete_preset.setToolTip("" if self.delete_preset.isEnabled() else
                                      "Choose one of your own presets to delete it (the built-in ones stay)")

    def _apply_preset(self) -> None:
        name = self.preset.currentText()
        if name != CHOOSE:
            self.set_values(presets.apply_overrides(self.defaults, self.saved.all()[name]).__dict__)
        self._preset_chosen()

    def _save_preset(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Name of the preset:")
        name = name.strip()
        if not ok or not name:
            return
        try:
            self.saved.save(name, self.values())
        except ValueError as e:
            dialogs.inform(self, "Save preset", str(e))
            return
        self._fill_presets(name)

    def _delete_preset(self) -> None:
        name = self.preset.currentText()
        if dialogs.confirm(self, "Delete preset", f"Delete the preset “{name}”? Chats that used it keep their values.",
                           "Delete"):
            self.saved.delete(name)
            self._fill_presets()


def _short(text: str) -> str:
    text = " ".join(text.split())
    return "none" if not text else (text if len(text) <= 40 else text[:39] + "…")

