"""How long reading `<tool_call>` blocks takes on a degenerate turn (minimind_trl/agent/parsing.py): a text of N
`<tool_call>` tags that never close, as a model stuck in a loop writes under a large `max_new_tokens`. Upstream's
non-greedy regex rescans the rest of the text from every unclosed tag (quadratic); `parse_tool_calls` reads it in
one pass. Prints the figures and ends with one JSON line; asserts nothing.

    python benchmarks/tool_call_parsing.py [--tags 1000 10000 20000 200000] [--upstream-max 2000]
"""

import argparse
import json
import re
import time

UPSTREAM_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)  # d65ef2c train_agent.py parse_tool_calls


def seconds(function, text: str) -> float:
    started = time.perf_counter()
    function(text)
    return time.perf_counter() - started


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=int, nargs="+", default=[1_000, 10_000, 20_000, 200_000])
    parser.add_argument("--upstream-max", type=int, default=2_000, help="largest N timed with upstream's regex")
    args = parser.parse_args(argv)

    from minimind_trl.agent.parsing import parse_tool_calls

    figures = {}
    for tags in args.tags:
        text = '<tool_call>{"name": "calculate_math", "arguments": {"expression": "1+1"}}' * tags
        ours = seconds(parse_tool_calls, text)
        upstream = seconds(UPSTREAM_BLOCK.findall, text) if tags <= args.upstream_max else None
        figures[tags] = {"characters": len(text), "parse_tool_calls_s": ours, "upstream_regex_s": upstream}
        shown = f"{upstream:.3f} s" if upstream is not None else "not timed (over --upstream-max)"
        print(f"{tags:>8} unclosed tags ({len(text):,} characters): parse_tool_calls {ours * 1e3:.2f} ms, "
              f"upstream's regex {shown}")
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
