"""The benchmark and parity workloads: fixed chat prompts, so every engine sees the same text.

W1 is 64 chat prompts of 40-120 tokens (with the chat template) x 128 greedy new tokens;
W2 is one prompt x 256 new tokens.
"""

from __future__ import annotations

QUESTIONS = (
    "What is the capital of France?",
    "Explain how a rainbow forms.",
    "Write a short poem about the sea.",
    "Why do cats purr?",
    "Give me three tips for learning a new language.",
    "What is the difference between weather and climate?",
    "Summarise the plot of Romeo and Juliet.",
    "How does a bicycle stay upright?",
    "What are prime numbers? Give examples.",
    "Describe the water cycle in simple terms.",
    "How do vaccines work?",
    "Write a haiku about autumn leaves.",
    "What causes the seasons on Earth?",
    "Explain recursion to a beginner programmer.",
    "What is photosynthesis?",
    "List some healthy breakfast ideas.",
    "Why is the sky blue?",
    "How do airplanes fly?",
    "What is the Pythagorean theorem?",
    "Tell me a fun fact about octopuses.",
    "How should I prepare for a job interview?",
    "What is machine learning?",
    "Explain what a black hole is.",
    "How do I make a cup of green tea?",
    "What were the main causes of the First World War?",
    "Describe a sunset over the mountains.",
    "How does the internet work?",
    "What is the role of the heart in the body?",
    "Give me a recipe for pancakes.",
    "What is the speed of light?",
    "How can I improve my sleep?",
    "Explain supply and demand.",
)

CONTEXT = (
    "Please answer clearly and keep the explanation friendly.",
    "I am a curious student who likes short, concrete examples.",
    "Assume I know a little about the topic but not the details.",
    "If there are common misconceptions, mention one of them.",
    "Use plain words and avoid jargon wherever possible.",
    "A short analogy from everyday life would help me remember it.",
    "I would also like to know why this matters in practice.",
    "Structure the answer so that it is easy to skim.",
    "Finish with a one-sentence summary of the key idea.",
    "Be careful with the details.",
)

SYSTEM_PROMPT = (
    "You are a careful assistant for a public library. Answer questions accurately, briefly and "
    "politely. When a question is ambiguous, state your assumption before answering."
)


def chat_prompts(count: int = 64) -> list[list[dict[str, str]]]:
    """``count`` chat conversations; the i-th adds ``1 + i % 7`` context sentences to vary length."""
    conversations = []
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)]
        extra = " ".join(CONTEXT[(i + j) % len(CONTEXT)] for j in range(1 + i % 7))
        content = f"{question} {extra}".strip()
        conversations.append([{"role": "user", "content": content}])
    return conversations


def shared_prefix_prompts(count: int = 16) -> list[list[dict[str, str]]]:
    """Conversations that all start with the same long system prompt (for prefix caching)."""
    return [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
            for i in range(count)]


def raw_prompts() -> list[str]:
    """Plain-text prompts of very different lengths (no chat template)."""
    return [
        "The quick brown fox",
        "Once upon a time, in a small village by the river, there lived an old clockmaker who",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "1, 2, 3, 5, 8, 13,",
        "The three laws of thermodynamics state that",
        "Paris is the capital of France. Berlin is the capital of Germany. Rome is the capital of",
        "In computer science, a hash table is",
        "Dear hiring manager, I am writing to apply for",
    ]
