"""Actor processes: they step environments, build and tokenise prompts, and stream finished records."""
