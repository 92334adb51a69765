"""Where each key of a YAML document is written, so an error about `lora.r` can name its line."""

from __future__ import annotations


def key_lines(text: str) -> dict[str, int]:
    """Dotted key path ("lora.target_modules") -> the 1-based line of `text` where that key is written,
    through nested mappings. Empty for text that is not valid YAML (its error carries its own line)."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                path = prefix + str(key.value)
                lines.setdefault(path, key.start_mark.line + 1)
                walk(value, path + ".")

    if root is not None:
        walk(root, "")
    return lines
