"""Programmatically generated math prompts: arithmetic word problems, unit
conversions, equations, geometry, percentages, number theory, probability.

Every template draws its numbers from a seeded random.Random, so a seed gives
the same prompts; numbers are chosen so that answers come out clean (integer
solutions, exact conversions where possible).
"""

from __future__ import annotations

import math
import random

NAMES = ["Ava", "Liam", "Noah", "Mia", "Lucas", "Zoe", "Omar", "Priya", "Kenji", "Sofia", "Mateo",
         "Amara", "Ethan", "Lena", "Ravi", "Chloe", "Diego", "Hana", "Jonas", "Fatima", "Leo",
         "Nora", "Samir", "Ines", "Tom", "Yuki", "Grace", "Ibrahim", "Elena", "Max"]
THINGS = ["apples", "stickers", "marbles", "pencils", "cookies", "books", "stamps", "cards",
          "oranges", "shells", "coins", "balloons", "cupcakes", "toy cars", "postcards"]
ITEMS = [("notebook", 3, 9), ("pen", 1, 4), ("sandwich", 4, 12), ("T-shirt", 8, 30),
         ("coffee", 2, 6), ("movie ticket", 7, 16), ("backpack", 20, 60), ("pair of socks", 3, 10),
         ("book", 6, 25), ("bottle of juice", 2, 5), ("lamp", 15, 45), ("plant", 5, 20)]
VEHICLES = ["car", "train", "bus", "cyclist", "truck", "boat", "motorbike", "runner"]
STYLE = ["", "", " Show your steps.", " Explain your reasoning.", " Think step by step.",
         " Give the final answer at the end.", " Show your work."]


def _pronoun(name: str) -> str:
    return "she" if name in {"Ava", "Mia", "Zoe", "Priya", "Sofia", "Amara", "Lena", "Chloe", "Hana",
                             "Fatima", "Nora", "Ines", "Yuki", "Grace", "Elena"} else "he"


def _plural(item: str) -> str:
    head, sep, tail = item.partition(" of ")
    return head + ("es" if head.endswith(("ch", "sh")) else "s") + sep + tail


def percent_of(r):
    p = r.choice([5, 10, 12, 15, 20, 25, 30, 35, 40, 45, 60, 75, 80, 90])
    n = r.choice([r.randint(2, 60) * 10, r.randint(10, 400), r.randint(1, 40) * 25])
    return "percent", r.choice([f"What is {p} percent of {n}?", f"Calculate {p}% of {n}.",
                                f"Find {p}% of {n}."])


def discount(r):
    item, lo, hi = r.choice(ITEMS)
    price = r.randint(lo, hi) * r.choice([1, 2, 5])
    p = r.choice([10, 15, 20, 25, 30, 40, 50])
    return "percent", r.choice([
        f"A {item} costs {price} dollars and is on sale for {p} percent off. What is the sale price?",
        f"A store reduces the price of a {price}-dollar {item} by {p}%. How much does it cost now?",
        f"After a {p}% discount, how much do you pay for a {item} that normally costs ${price}?"])


def percent_change(r):
    a = r.randint(4, 80) * 5
    b = a + r.choice([-1, 1]) * a * r.choice([10, 20, 25, 40, 50]) // 100
    what = r.choice(["The price of a ticket", "A town's population (in hundreds)",
                     "The number of visitors to a museum", "A monthly electricity bill"])
    return "percent", f"{what} changed from {a} to {b}. What is the percentage change?"


def speed(r):
    v = r.choice(VEHICLES)
    kmh = r.choice([12, 15, 18, 20, 24, 30, 36, 40, 45, 48, 60, 72, 80, 90, 96, 100, 120])
    minutes = r.choice([15, 20, 30, 40, 45, 90, 120, 150])
    d = kmh * minutes / 60
    if d != int(d):
        minutes, d = 60, kmh
    return "rates", r.choice([
        f"A {v} travels {int(d)} kilometers in {minutes} minutes. What is its average speed in km/h?",
        f"How long does it take a {v} moving at {kmh} km/h to cover {int(d)} km? Answer in minutes.",
        f"A {v} moves at {kmh} km/h for {minutes} minutes. How far does it go?"])


def shopping(r):
    name = r.choice(NAMES)
    (i1, lo1, hi1), (i2, lo2, hi2) = r.sample(ITEMS, 2)
    a, b = r.randint(2, 6), r.randint(1, 5)
    p, q = r.randint(lo1, hi1), r.randint(lo2, hi2)
    paid = (a * p + b * q + r.randint(1, 30)) // 10 * 10 + 10
    return "word", r.choice([
        f"{name} buys {a} of item A ({i1}) at {p} dollars each and {b} of item B ({i2}) at {q} dollars "
        f"each. How much does {_pronoun(name)} spend in total?",
        f"{name} buys {a} {_plural(i1)} for ${p} each and {b} {_plural(i2)} for ${q} each, paying with ${paid}. "
        f"How much change does {_pronoun(name)} get?"])


def counting(r):
    n1, n2 = r.sample(NAMES, 2)
    t = r.choice(THINGS)
    a, b, c = r.randint(8, 60), r.randint(1, 7), r.randint(2, 15)
    return "word", r.choice([
        f"{n1} has {a} {t}. {_pronoun(n1).capitalize()} gives {b} to {n2} and then gets {c} more. "
        f"How many {t} does {n1} have now?",
        f"{n1} collects {a} {t} on Monday and {c} on Tuesday, then loses {b}. How many are left?",
        f"{n1} has {a} {t} and {n2} has {c} more than {n1}. How many {t} do they have together?",
        f"{n1} shares {a * b} {t} equally among {b} friends. How many does each friend get?"])


def groups(r):
    name = r.choice(NAMES)
    boxes, per, extra = r.randint(3, 12), r.randint(4, 24), r.randint(0, 9)
    t = r.choice(THINGS)
    return "word", r.choice([
        f"{name} packs {t} into {boxes} boxes with {per} in each box, and has {extra} left over. "
        f"How many {t} were there?",
        f"A class of {boxes * per} students is split into teams of {per}. How many teams are there?",
        f"There are {boxes} shelves with {per} {t} on each. If {extra} are removed, how many remain?"])


def linear_eq(r):
    x = r.randint(-12, 15)
    a = r.choice([2, 3, 4, 5, 6, 7, 8, 9, 11, 12])
    b = r.randint(-30, 30)
    form = r.randrange(4)
    if form == 0:
        eq = f"{a}x {'+' if b >= 0 else '-'} {abs(b)} = {a * x + b}"
    elif form == 1:
        eq = f"{a}(x {'+' if b >= 0 else '-'} {abs(b)}) = {a * (x + b)}"
    elif form == 2:
        c = r.choice([d for d in (2, 3, 4, 5) if d != a])
        eq = f"{a}x + {b} = {c}x + {(a - c) * x + b}"
    else:
        eq = f"x/{a} + {b} = {x + b * a}/{a}" if x % a else f"x/{a} + {b} = {x // a + b}"
    return "algebra", r.choice([f"Solve for x: {eq}.", f"Find x if {eq}.", f"Solve the equation {eq}."])


def system(r):
    x, y = r.randint(-6, 9), r.randint(-6, 9)
    a, b, d, e = r.randint(1, 6), r.randint(1, 6), r.randint(1, 6), r.randint(1, 6)
    if a * e == b * d:
        e += 1
    return "algebra", (f"Solve the system of equations: {a}x + {b}y = {a * x + b * y} and "
                       f"{d}x - {e}y = {d * x - e * y}.")


def quadratic(r):
    p, q = r.randint(-9, 9), r.randint(-9, 9)
    b, c = -(p + q), p * q
    bs = f" {'+' if b >= 0 else '-'} {abs(b)}x" if b else ""
    cs = f" {'+' if c >= 0 else '-'} {abs(c)}" if c else ""
    return "algebra", r.choice([f"Find the roots of x^2{bs}{cs} = 0.",
                                f"Factor x^2{bs}{cs} and solve x^2{bs}{cs} = 0."])


CONVERSIONS = [
    ("kilometers", "miles", 0.621371), ("miles", "kilometers", 1.609344), ("kilograms", "pounds", 2.20462),
    ("pounds", "kilograms", 0.453592), ("meters", "feet", 3.28084), ("inches", "centimeters", 2.54),
    ("liters", "milliliters", 1000), ("gallons", "liters", 3.78541), ("hours", "minutes", 60),
    ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7), ("kilobytes", "bytes", 1024),
    ("megabytes", "kilobytes", 1024), ("grams", "milligrams", 1000), ("meters", "centimeters", 100),
    ("square meters", "square centimeters", 10000), ("tons", "kilograms", 1000),
    ("meters per second", "kilometers per hour", 3.6), ("ounces", "grams", 28.3495)]


def conversion(r):
    frm, to, _ = r.choice(CONVERSIONS)
    v = r.choice([r.randint(2, 90), r.randint(1, 20) * 0.5, r.randint(1, 12) * 25])
    v = int(v) if v == int(v) else v
    if r.random() < 0.25:
        c = r.randint(-20, 45)
        return "units", r.choice([f"Convert {c} degrees Celsius to Fahrenheit.",
                                  f"What is {c * 9 // 5 + 32} degrees Fahrenheit in Celsius?"])
    return "units", r.choice([f"Convert {v} {frm} to {to}.", f"How many {to} are in {v} {frm}?",
                              f"Express {v} {frm} in {to}."])


def geometry(r):
    a, b = r.randint(2, 25), r.randint(2, 25)
    shape = r.randrange(7)
    if shape == 0:
        return "geometry", f"What is the perimeter of a rectangle that is {a} cm long and {b} cm wide?"
    if shape == 1:
        return "geometry", f"A circle has a radius of {a} meters. What are its area and circumference?"
    if shape == 2:
        return "geometry", f"Find the area of a triangle with a base of {a} inches and a height of {b} inches."
    if shape == 3:
        k = r.randint(1, 6)
        x, y, z = r.choice([(3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (6, 8, 10)])
        return "geometry", (f"A right triangle has legs of {x * k} and {y * k} units. "
                            f"How long is the hypotenuse?")
    if shape == 4:
        c = r.randint(2, 12)
        return "geometry", f"What is the volume of a box measuring {a} cm by {b} cm by {c} cm?"
    if shape == 5:
        return "geometry", (f"A cylinder has a radius of {a} cm and a height of {b} cm. "
                            f"What is its volume?")
    return "geometry", (f"A square garden has an area of {a * a} square meters. "
                        f"How long is each side, and what is its perimeter?")


def statistics(r):
    n = r.randint(4, 7)
    xs = [r.randint(1, 60) for _ in range(n)]
    lst = ", ".join(map(str, xs))
    return "statistics", r.choice([f"Find the mean and the median of {lst}.",
                                   f"What is the average of {lst}?",
                                   f"What is the range of the data set {lst}?",
                                   f"Find the mode and the median of {lst}, {xs[0]}."])


def number_theory(r):
    k = r.randrange(6)
    if k == 0:
        n = r.randint(20, 400)
        return "numbers", r.choice([f"Is {n} a prime number? Explain.", f"Is {n} prime?"])
    if k == 1:
        a, b = r.randint(2, 30) * r.choice([2, 3, 4, 6]), r.randint(2, 30) * r.choice([2, 3, 5])
        return "numbers", f"What is the greatest common divisor of {a} and {b}?"
    if k == 2:
        a, b = r.randint(3, 24), r.randint(3, 24)
        return "numbers", f"What is the least common multiple of {a} and {b}?"
    if k == 3:
        n = r.randint(12, 360)
        return "numbers", f"What is the prime factorization of {n}?"
    if k == 4:
        n = r.randint(2, 20)
        return "numbers", r.choice([f"What is {n} squared?", f"What is the square root of {n * n}?",
                                    f"What is {r.randint(2, 5)} to the power of {r.randint(2, 6)}?"])
    n = r.randint(10, 999)
    return "numbers", f"Write {n} in binary."


def fractions(r):
    a, b, c, d = r.randint(1, 9), r.randint(2, 12), r.randint(1, 9), r.randint(2, 12)
    op = r.choice(["+", "-", "×", "÷"])
    return "fractions", r.choice([f"What is {a}/{b} {op} {c}/{d}? Simplify the result.",
                                  f"Compute {a}/{b} {op} {c}/{d} and give the answer as a fraction.",
                                  f"Simplify the fraction {a * c * 2}/{b * c * 2}.",
                                  f"Convert {a}/{b} to a decimal and a percentage."])


def sequences(r):
    a, d = r.randint(1, 20), r.randint(2, 9)
    if r.random() < 0.5:
        seq = [a + i * d for i in range(5)]
    else:
        q = r.choice([2, 3])
        seq = [a * q ** i for i in range(5)]
    lo, hi = r.randint(1, 50), r.randint(60, 300)
    return "sequences", r.choice([f"What is the next number in the sequence {', '.join(map(str, seq))}?",
                                  f"What is the sum of all integers from {lo} to {hi}?",
                                  f"Find the {r.randint(8, 30)}th term of the sequence "
                                  f"{', '.join(map(str, seq[:4]))}, ..."])


def interest(r):
    p = r.choice([500, 1000, 1200, 2000, 2500, 5000, 10000])
    rate = r.choice([2, 3, 4, 5, 6, 8, 10])
    years = r.randint(2, 10)
    saver = r.choice(NAMES)
    return "finance", r.choice([
        f"If you invest {p} dollars at {rate}% annual interest compounded yearly, how much will you "
        f"have after {years} years?",
        f"How much simple interest does a loan of ${p} earn at {rate}% per year over {years} years?",
        f"{saver} saves {p // 10} dollars a month. How long until {_pronoun(saver)} has {p * 3} dollars?"])


def probability(r):
    red, blue = r.randint(1, 12), r.randint(1, 12)
    k = r.randrange(4)
    if k == 0:
        return "probability", (f"A bag has {red} red and {blue} blue marbles. If you pick one at random, "
                               f"what is the probability that it is red?")
    if k == 1:
        s = r.randint(3, 11)
        return "probability", f"When rolling two fair dice, what is the probability that the sum is {s}?"
    if k == 2:
        n = r.randint(2, 5)
        return "probability", f"If you flip a fair coin {n} times, what is the probability of getting all heads?"
    return "probability", (f"A bag has {red} red and {blue} blue marbles. Two are drawn without "
                           f"replacement. What is the probability that both are blue?")


def ratio(r):
    a, b = r.randint(1, 7), r.randint(1, 7)
    total = (a + b) * r.randint(2, 40)
    n1, n2 = r.sample(NAMES, 2)
    return "ratio", r.choice([f"{n1} and {n2} share {total} dollars in the ratio {a}:{b}. How much does each get?",
                              f"A recipe for {a + 1} people uses {b * 100} grams of flour. How much flour is "
                              f"needed for {a + 1 + r.randint(1, 8)} people?",
                              f"Simplify the ratio {a * 6}:{b * 6}."])


def work_rate(r):
    n1, n2 = r.sample(NAMES, 2)
    a, b = r.choice([(2, 3), (3, 6), (4, 12), (6, 3), (5, 20), (10, 15), (4, 4), (6, 12)])
    job = r.choice(["paint a fence", "clean the house", "mow the lawn", "fill a pool", "sort the mail"])
    return "rates", f"{n1} can {job} in {a} hours and {n2} can do it in {b} hours. How long does it take them working together?"


def clock(r):
    h, m = r.randint(1, 11), r.choice([0, 5, 10, 15, 20, 25, 30, 40, 45, 50])
    d = r.choice([35, 50, 75, 90, 105, 125, 140, 165])
    ev = r.choice(["A movie", "A train ride", "A meeting", "A football match", "A concert"])
    return "time", r.choice([f"{ev} starts at {h}:{m:02d} pm and lasts {d} minutes. When does it end?",
                             f"How many minutes are there between {h}:{m:02d} am and {h + 1}:{(m + 17) % 60:02d} pm?"])


def arithmetic(r):
    k = r.randrange(5)
    a, b = r.randint(12, 999), r.randint(3, 99)
    if k == 0:
        return "arithmetic", f"What is {a} × {b}?"
    if k == 1:
        return "arithmetic", f"What is {a * b + r.randint(0, b - 1)} divided by {b}? Give the quotient and remainder."
    if k == 2:
        return "arithmetic", f"Calculate {a} + {b} × {r.randint(2, 9)} - {r.randint(1, 50)}."
    if k == 3:
        x = round(r.uniform(1, 100), 2)
        return "arithmetic", f"Round {x} to the nearest whole number and to one decimal place."
    return "arithmetic", f"Write {r.randint(1, 9)}{r.choice(['0' * 5, '0' * 6, '0' * 8])} in scientific notation."


def age(r):
    n1, n2 = r.sample(NAMES, 2)
    young = r.randint(3, 15)
    k = r.choice([2, 3, 4])
    later = r.randint(2, 10)
    return "word", r.choice([
        f"{n1} is {k} times as old as {n2}. If {n2} is {young}, how old will {n1} be in {later} years?",
        f"In {later} years, {n1} will be {young + later + k * 5} years old. How old was {n1} {k} years ago?"])


TEMPLATES = [percent_of, discount, percent_change, speed, shopping, counting, groups, linear_eq, system,
             quadratic, conversion, geometry, statistics, number_theory, fractions, sequences, interest,
             probability, ratio, work_rate, clock, arithmetic, age]


def generate(seed: int, count: int) -> list[tuple[str, str]]:
    """(topic, prompt) pairs; `count` draws (duplicates possible, removed later)."""
    r = random.Random(seed)
    out = []
    for _ in range(count):
        topic, text = r.choice(TEMPLATES)(r)
        out.append((topic, text + r.choice(STYLE)))
    return out


if __name__ == "__main__":
    for t, p in generate(1, 30):
        print(t, "|", p)
    assert math.isclose(1, 1)
