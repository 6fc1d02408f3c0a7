"""Stand-in for sglang/srt/environ.py (SGLang 0.5.23): typed environment fields, the Engram knobs and SGLANG_PLUGINS."""
import os


class EnvField:
    def __init__(self, default):
        self.default = default

    def __set_name__(self, owner, name):
        self.name = name

    def parse(self, value):
        raise NotImplementedError

    def get(self):
        value = os.getenv(self.name)
        return self.default if value is None else self.parse(value)

    def is_set(self):
        return self.name in os.environ


class EnvBool(EnvField):
    def parse(self, value):
        value = value.lower()
        if value in ("true", "1", "yes", "y"):
            return True
        if value in ("false", "0", "no", "n"):
            return False
        raise ValueError(f'"{value}" is not a valid boolean value')


class EnvStr(EnvField):
    def parse(self, value):
        return value


class Envs:
    SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE = EnvBool(False)
    SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT = EnvStr("shared")
    SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING = EnvBool(False)
    SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS = EnvBool(False)
    SGLANG_PLUGINS = EnvStr("")


envs = Envs()
