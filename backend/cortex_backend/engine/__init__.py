"""The torch side: model loading, LoRA, losses, training steps and sampling. Imported by workers only."""
