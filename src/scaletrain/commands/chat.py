"""`scaletrain chat RUN_DIR [--prompt TEXT]`: talk to a run's model through its trained template (chat.py)."""

from __future__ import annotations

import argparse

from scaletrain.commands.args import COUNT, NONNEGATIVE_REAL


def register(sub: argparse._SubParsersAction, parents) -> None:
    p = sub.add_parser("chat", parents=parents, help="talk to a run's model through the template it trained with")
    p.add_argument("run_dir", help="a finished causal-LM run directory")
    p.add_argument("--prompt", help="one message: print the answer and exit (no terminal needed)")
    p.add_argument("--system", help="a system prompt")
    p.add_argument("--image", action="append", default=[], metavar="FILE",
                   help="an image the first message is about (a vision-language run; repeat for several)")
    p.add_argument("--max-new-tokens", type=COUNT, default=256, help="the longest reply, in tokens")
    p.add_argument("--temperature", type=NONNEGATIVE_REAL, default=0.0, help="0: greedy (default)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from scaletrain.after.chat import open_chat, read_image
    from scaletrain.errors import ConfigError

    if args.max_new_tokens < 1 or args.temperature < 0:
        raise ConfigError("--max-new-tokens must be >= 1 and --temperature >= 0")
    chat = open_chat(args.run_dir, args.system)
    if args.image and chat.image_text is None:
        raise ConfigError(f"--image: {args.run_dir} trained a text model, which cannot read images")
    images = [read_image(path, chat.bounds) for path in args.image]
    if args.prompt is not None:
        print(chat.reply(args.prompt, args.max_new_tokens, args.temperature, images=images))
        return 0
    from transformers import TextStreamer

    streamer = TextStreamer(chat.tokenizer, skip_prompt=True, skip_special_tokens=True)
    print("chat with the run's model (its trained template); an empty line or Ctrl-D ends")
    while True:
        try:
            text = input("> ").strip()
        except EOFError:
            break
        if not text:
            break
        chat.reply(text, args.max_new_tokens, args.temperature, streamer=streamer, images=images)
        images = []  # the first message's: the conversation keeps them
    return 0
