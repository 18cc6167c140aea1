"""The environment stage: facts about the runner, the user's interpreter and its torch, and how
two runners differ."""
