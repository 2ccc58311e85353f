"""Gradio web UI for chattts_velocity (`python webui/app.py` or `chattts-velocity webui`)."""
