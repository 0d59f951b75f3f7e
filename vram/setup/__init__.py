"""The training setup: every knob a person sets, each declared once with how people meet it
(`Knob`), validated and frozen (`TrainingSetup`)."""
