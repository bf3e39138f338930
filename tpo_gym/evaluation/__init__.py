"""The evaluation harness: experiments, presets, metrics and benchmark reports."""
