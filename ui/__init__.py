"""Streamlit helpers shared by the app's pages: inputs, URL state, rendering.

Pages stay thin: read the widgets (`ui.inputs`), turn them into a validated setup
(`ui.params`), call `vram`, and display what comes back (`ui.render`). Only this package and the
page scripts import Streamlit; `vram` never does.
"""
