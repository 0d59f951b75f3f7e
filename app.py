"""The app: the calculator first, then every page in pages/ (a new file there appears by itself).

Run with ``streamlit run app.py``. `st.navigation` names the first entry "Calculator" (the
automatic pages/ listing would call it "app"); the other titles and URL paths come from the
file names as before (``pages/1_Learn.py`` -> "Learn", ``/Learn``), so old links still work.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parent

pages = [st.Page(str(ROOT / "calculator.py"), title="Calculator", icon="🧮", default=True)]
pages += [st.Page(str(path)) for path in sorted((ROOT / "pages").glob("*.py"))]
st.navigation(pages).run()
