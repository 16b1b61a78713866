"""Model building blocks: linear, norm, rotary, activation, embedding and attention layers."""
