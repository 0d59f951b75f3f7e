"""What goes in and comes out as text: each knob's surfaces (CLI flags, URL keys, case-file
columns), reports, export to other tools' configs, the measured-runs runner, and the readers
of training configs."""
