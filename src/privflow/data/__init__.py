"""The table layer: the schema, the total reader, validation, the codecs and the target head's table side."""
