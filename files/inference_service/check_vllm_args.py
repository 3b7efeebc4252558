"""Parse a `vllm serve` command line with the vLLM of the image this runs in, starting nothing.

    <image's python> check_vllm_args.py [serve arguments...]

Runs inside the pinned image before a unit changes (deploys/inference_service.py), so a flag the image's
vLLM does not know, a bad value (`-tp two`) or a refused combination fails that host with vLLM's own
message while the running service stays untouched. Exit 0: accepted; 2: refused (message on stderr).
Uses vLLM's own parser (`make_arg_parser`), its `parse_args` (which expands dotted `--x.y` flags) and
`validate_parsed_serve_args`; it does not load the model.
"""

import sys


def main(argv: list[str]) -> int:
    try:
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:  # vLLM < 0.11
            from vllm.utils import FlexibleArgumentParser
    except Exception as e:  # noqa: BLE001 - any import failure means the image cannot serve
        print(f"vLLM in this image cannot be imported: {type(e).__name__}: {e}", file=sys.stderr)
        return 2

    class Parser(FlexibleArgumentParser):
        def error(self, message):  # vLLM's one-line reason, not 1600 lines of usage
            raise SystemExit(f"vllm serve: error: {message}")

    parser = make_arg_parser(Parser(prog="vllm serve"))
    try:
        args = parser.parse_args(argv)
        validate_parsed_serve_args(args)
    except SystemExit as e:
        if e.code in (0, None):
            return 0
        print(e.code if isinstance(e.code, str) else f"vllm serve: exit {e.code}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - vLLM raises TypeError/ValueError for refused combinations
        print(f"vllm serve: error: {e}", file=sys.stderr)
        return 2
    print(f"accepted by vLLM {getattr(__import__('vllm'), '__version__', '?')}: {len(argv)} argument(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
