"""Code prompts: "write a function that ..." requests across languages, SQL,
shell, git and regular-expression questions (templated), and requests about real
code snippets (explain, document, test, port, review) taken from sources.py.
"""

from __future__ import annotations

import random

LANGS = ["Python"] * 4 + ["JavaScript"] * 2 + ["TypeScript", "C", "C++", "Java", "Go", "Rust", "C#",
                                                "Ruby", "Kotlin", "PHP"]

# What the function does, phrased to follow "a function that ...".
FUNCTION_SPECS = [
    "reverses a string", "counts the vowels in a string", "checks whether a number is prime",
    "returns the n-th Fibonacci number", "removes duplicate items from a list while keeping their order",
    "merges two sorted lists into one sorted list", "finds the second largest number in a list",
    "checks whether two strings are anagrams", "converts a temperature from Celsius to Fahrenheit",
    "counts how many times each word appears in a sentence", "flattens a nested list",
    "returns the greatest common divisor of two integers", "checks whether a year is a leap year",
    "capitalizes the first letter of every word in a string", "computes the average of a list of numbers",
    "finds the longest word in a sentence", "rotates an array by k positions",
    "checks whether a string contains only digits", "converts a Roman numeral to an integer",
    "converts an integer to a Roman numeral", "returns the sum of the digits of a number",
    "performs binary search on a sorted array", "sorts a list of numbers with bubble sort",
    "implements insertion sort", "implements merge sort", "implements quicksort",
    "returns all prime numbers below n", "checks whether parentheses in a string are balanced",
    "computes the factorial of n iteratively", "transposes a matrix", "multiplies two matrices",
    "returns the intersection of two lists", "finds the most frequent element in a list",
    "converts a binary string to a decimal number", "validates an email address with a simple pattern",
    "counts the lines, words and characters of a text", "chunks a list into groups of size n",
    "computes the running total of a list", "returns the median of a list of numbers",
    "checks whether a number is a power of two", "removes all whitespace from a string",
    "finds the missing number in a list containing 0 to n", "computes the dot product of two vectors",
    "generates a random password of a given length", "truncates a string to n characters with an ellipsis",
    "groups a list of words by their first letter", "returns the k largest elements of a list",
    "converts a snake_case string to camelCase", "checks whether a string is a valid IPv4 address",
    "computes the Levenshtein distance between two strings", "returns the length of the longest common prefix of a list of strings",
    "finds all pairs in a list that sum to a target value", "checks whether a linked list has a cycle",
    "reverses a singly linked list", "computes the depth of a binary tree",
    "performs a breadth-first search on a graph given as an adjacency list",
    "counts the number of islands in a grid of 0s and 1s", "computes x to the power n by repeated squaring",
    "parses a query string like a=1&b=2 into a dictionary", "formats a number of seconds as HH:MM:SS",
    "returns the number of days between two dates", "zips two lists into a list of pairs",
    "clamps a value between a minimum and a maximum", "computes compound interest",
    "checks whether a sentence is a pangram", "encodes a string with the Caesar cipher",
    "compresses a string using run-length encoding", "splits a full name into first and last name",
    "returns the unique characters of a string", "finds the index of the first non-repeating character",
    "computes the area of a polygon from its vertices", "converts a hex color like #ff8800 to RGB values",
    "deep-copies a nested dictionary", "memoizes the results of another function",
    "retries a failing operation up to three times", "reads a CSV file and returns the rows as dictionaries",
    "writes a list of strings to a file, one per line", "debounces calls to another function",
    "implements a stack with push, pop and peek", "implements a queue using two stacks",
    "implements a simple LRU cache", "checks whether a number is an Armstrong number",
    "returns the binary representation of an integer", "counts the set bits of an integer",
    "finds the maximum subarray sum (Kadane's algorithm)", "generates all permutations of a string",
    "generates all subsets of a set", "checks whether a Sudoku row is valid",
    "computes the checksum of a credit card number with the Luhn algorithm",
    "converts a list of key-value pairs into a dictionary", "sorts a list of records by two keys",
    "returns the n most common words in a text", "pads a string on the left with zeros",
]

SQL_TABLES = [
    ("employees", ["id", "name", "department", "salary", "hire_date"]),
    ("orders", ["id", "customer_id", "total", "status", "created_at"]),
    ("products", ["id", "name", "category", "price", "stock"]),
    ("students", ["id", "name", "grade", "score", "city"]),
    ("books", ["id", "title", "author", "year", "pages"]),
    ("flights", ["id", "origin", "destination", "departure", "seats"]),
]

SHELL_JOBS = [
    "finds all .log files larger than 10 MB under the current directory",
    "prints the 10 largest files in a directory", "counts how many times the word error appears in app.log",
    "renames every .jpeg file in a folder to .jpg", "shows the disk usage of each subdirectory, sorted by size",
    "prints the lines that appear in file a.txt but not in b.txt", "replaces foo with bar in every .txt file",
    "lists the processes using the most memory", "extracts the second column of a CSV file",
    "creates a compressed tar archive of a folder", "downloads a file and checks its SHA-256 sum",
    "prints the number of unique IP addresses in an access log", "deletes files older than 30 days in /tmp/cache",
    "shows which process is listening on port 8080", "prints every line of a file in reverse order",
    "monitors a log file and prints new lines as they appear", "sorts a file numerically by its third column",
    "counts the files in each subdirectory", "prints the current date in ISO 8601 format",
    "backs up a directory into a file named with today's date", "finds duplicate lines in a file",
    "loops over all .csv files and prints their line counts", "checks whether a command exists before running it",
    "reads a file line by line and prints the lines that are longer than 80 characters",
    "prints the environment variables whose names start with PATH",
]

GIT_COMMANDS = [
    "git rebase -i HEAD~3", "git stash pop", "git cherry-pick", "git reset --soft HEAD~1",
    "git reset --hard", "git revert", "git bisect", "git reflog", "git log --oneline --graph",
    "git diff --staged", "git fetch --prune", "git merge --no-ff", "git commit --amend",
    "git clean -fd", "git blame", "git tag -a v1.0", "git remote -v", "git submodule update --init",
    "git worktree add", "git switch -c feature", "git restore --staged", "git pull --rebase",
    "git push --force-with-lease", "git shortlog -sn", "git checkout -- file.txt", "git add -p",
]

REGEX_TARGETS = [
    "a US ZIP code (5 digits, optionally followed by a dash and 4 digits)", "a date in YYYY-MM-DD format",
    "a time in 24-hour HH:MM format", "a hexadecimal color code like #1a2b3c", "an IPv4 address",
    "a word that starts and ends with the same letter", "a line that contains only whitespace",
    "a simple email address", "a number with an optional decimal part", "a URL starting with http or https",
    "a string of exactly 8 alphanumeric characters", "repeated words such as 'the the'",
    "a phone number like (555) 123-4567", "a Python variable name", "a semantic version such as 1.12.3",
]

CONCEPTS = [
    ("recursion", None), ("a closure", None), ("a race condition", None), ("a deadlock", None),
    ("big-O notation", None), ("a hash table", None), ("dependency injection", None),
    ("the difference between a process and a thread", None), ("immutability", None),
    ("a REST API", None), ("garbage collection", None), ("a memory leak", None), ("unit testing", None),
    ("the difference between == and is in Python", "Python"), ("list comprehensions", "Python"),
    ("generators and the yield keyword", "Python"), ("decorators", "Python"),
    ("the event loop", "JavaScript"), ("promises and async/await", "JavaScript"),
    ("the difference between let, const and var", "JavaScript"), ("pointers", "C"),
    ("the difference between the stack and the heap", None), ("ownership and borrowing", "Rust"),
    ("goroutines and channels", "Go"), ("interfaces", "Go"), ("RAII", "C++"), ("smart pointers", "C++"),
    ("templates", "C++"), ("virtual functions", "C++"), ("generics", "Java"), ("the JVM", "Java"),
    ("SQL joins", "SQL"), ("database indexes", "SQL"), ("transactions and ACID", None),
    ("version control", None), ("continuous integration", None), ("a Docker container", None),
    ("the difference between TCP and UDP", None), ("DNS", None), ("public-key cryptography", None),
    ("a binary search tree", None), ("dynamic programming", None), ("a linked list", None),
    ("regular expressions", None), ("floating-point rounding errors", None), ("Unicode and UTF-8", None),
]

SNIPPET_REQUESTS = [
    "Explain what this {lang} code does:\n\n```{tag}\n{code}\n```",
    "What does the following {lang} function do? Describe it step by step.\n\n```{tag}\n{code}\n```",
    "Write a docstring for this {lang} function:\n\n```{tag}\n{code}\n```",
    "Suggest improvements to this {lang} code:\n\n```{tag}\n{code}\n```",
    "Write a few unit tests for this {lang} function:\n\n```{tag}\n{code}\n```",
    "Rewrite this {lang} function with type hints and comments:\n\n```{tag}\n{code}\n```",
    "Summarize in two sentences what this code is for:\n\n```{tag}\n{code}\n```",
    "Translate this {lang} function into JavaScript:\n\n```{tag}\n{code}\n```",
    "Are there any bugs or edge cases in this {lang} code?\n\n```{tag}\n{code}\n```",
]

SCRIPT_REQUESTS = [
    "Explain what this {lang} script does:\n\n```{tag}\n{code}\n```",
    "Add comments to this {lang} script explaining each step:\n\n```{tag}\n{code}\n```",
    "What could go wrong when running this {lang} script?\n\n```{tag}\n{code}\n```",
]


def function_requests(r: random.Random, count: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(count):
        spec, lang = r.choice(FUNCTION_SPECS), r.choice(LANGS)
        text = r.choice([
            f"Write a {lang} function that {spec}.",
            f"Write a {lang} function that {spec}. Include a short example of how to call it.",
            f"How would you write a {lang} function that {spec}?",
            f"Implement a function in {lang} that {spec}, and explain how it works.",
            f"Write a {lang} function that {spec}, with comments.",
            f"Write a function that {spec} in {lang}, and state its time complexity.",
        ])
        out.append(("function", text))
    return out


def sql_requests(r: random.Random, count: int) -> list[tuple[str, str]]:
    out = []
    for _ in range(count):
        table, cols = r.choice(SQL_TABLES)
        num = r.choice([c for c in cols if c in ("salary", "total", "price", "stock", "score", "year",
                                                 "pages", "seats")])
        grp = r.choice([c for c in cols if c in ("department", "status", "category", "city", "grade",
                                                 "author", "origin", "destination", "customer_id")])
        n = r.choice([3, 5, 10, 20, 100, 500, 1000, 2000])
        text = r.choice([
            f"Write a SQL query that selects all rows from {table} where {num} is greater than {n}.",
            f"Write a SQL query that returns the average {num} for each {grp} in the {table} table.",
            f"Write a SQL query that finds the top {r.randint(3, 10)} rows of {table} by {num}.",
            f"Write a SQL query that counts the rows of {table} grouped by {grp}, most frequent first.",
            f"Given a table {table}({', '.join(cols)}), write a query that finds the {grp} values "
            f"whose total {num} exceeds {n}.",
            f"Write a SQL statement that creates the table {table} with the columns {', '.join(cols)}.",
            f"Explain the difference between WHERE and HAVING using the {table} table as an example.",
        ])
        out.append(("sql", text))
    return out


def misc_requests(r: random.Random) -> list[tuple[str, str]]:
    out = []
    for t in SHELL_JOBS:
        out.append(("shell", r.choice([f"Write a bash command that {t}.",
                                       f"How can I write a shell one-liner that {t}?"])))
    for g in GIT_COMMANDS:
        out.append(("git", r.choice([f"What does `{g}` do?", f"When would I use `{g}`?",
                                     f"Explain the git command `{g}` with an example."])))
    for x in REGEX_TARGETS:
        out.append(("regex", r.choice([f"Write a regular expression that matches {x}.",
                                       f"Give me a regex for {x} and explain each part."])))
    for concept, lang in CONCEPTS:
        where = f" in {lang}" if lang else ""
        out.append(("concept", r.choice([f"Explain {concept}{where} with a short example.",
                                         f"What is {concept}{where}? Keep it simple.",
                                         f"Can you explain {concept}{where} to a beginner?"])))
    return out


def snippet_requests(r: random.Random, functions: list[tuple[str, str]], count: int) -> list[tuple[str, str, str]]:
    """(topic, prompt, origin file) requests about real Python functions."""
    out = []
    for module, code in r.sample(functions, min(count, len(functions))):
        t = r.choice(SNIPPET_REQUESTS)
        out.append(("snippet", t.format(lang="Python", tag="python", code=code), module))
    return out


def script_requests(r: random.Random, scripts: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str]]:
    """(topic, prompt, package) requests about example scripts shipped in /usr/share/doc."""
    names = {"bash": "shell", "python": "Python", "perl": "Perl"}
    out = []
    for pkg, _path, lang, code in scripts:
        t = r.choice(SCRIPT_REQUESTS)
        out.append(("script", t.format(lang=names[lang], tag=lang, code=code), pkg))
    return out
