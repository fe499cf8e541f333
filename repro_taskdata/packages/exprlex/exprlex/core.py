"""A tokenizer, a shunting-yard parser to reverse Polish notation and an RPN evaluator for
expressions such as ``2 * (x + 3) - 4 / y``."""

OPERATORS = "+-*/^"


def tokenize(source):
    """Split ``source`` into numbers, names, operators and parentheses (whitespace is dropped)."""
    tokens = []
    index = 0
    while index < len(source):
        char = source[index]
        if char.isspace():
            index += 1
        elif char.isdigit() or char == ".":
            start = index
            while index < len(source) and (source[index].isdigit() or source[index] == "."):
                index += 1
            tokens.append(source[start:index])
        elif char.isalpha() or char == "_":
            start = index
            while index < len(source) and (source[index].isalnum() or source[index] == "_"):
                index += 1
            tokens.append(source[start:index])
        elif char in OPERATORS or char in "()":
            tokens.append(char)
            index += 1
        else:
            raise ValueError(f"unexpected character {char!r} at {index}")
    return tokens


def is_number(token):
    """True for tokens like ``12`` or ``3.5`` (at most one dot, at least one digit)."""
    if token.count(".") > 1:
        return False
    digits = token.replace(".", "")
    return len(digits) > 0 and digits.isdigit()


def precedence(op):
    """Binding strength: ``^`` 3, ``*`` and ``/`` 2, ``+`` and ``-`` 1."""
    if op == "^":
        return 3
    if op in "*/":
        return 2
    if op in "+-":
        return 1
    raise ValueError(f"not an operator: {op!r}")


def to_rpn(tokens):
    """Shunting-yard: infix tokens -> reverse Polish notation (``^`` is right-associative)."""
    output = []
    stack = []
    for token in tokens:
        if token in OPERATORS:
            while stack and stack[-1] != "(":
                top = stack[-1]
                if precedence(top) > precedence(token) or (precedence(top) == precedence(token) and token != "^"):
                    output.append(stack.pop())
                else:
                    break
            stack.append(token)
        elif token == "(":
            stack.append(token)
        elif token == ")":
            while stack and stack[-1] != "(":
                output.append(stack.pop())
            if not stack:
                raise ValueError("unbalanced parentheses")
            stack.pop()
        else:
            output.append(token)
    while stack:
        top = stack.pop()
        if top == "(":
            raise ValueError("unbalanced parentheses")
        output.append(top)
    return output


def eval_rpn(rpn, env=None):
    """Evaluate reverse Polish notation; names are looked up in ``env``."""
    env = env or {}
    stack = []
    for token in rpn:
        if token in OPERATORS:
            if len(stack) < 2:
                raise ValueError("missing operand")
            right = stack.pop()
            left = stack.pop()
            if token == "+":
                stack.append(left + right)
            elif token == "-":
                stack.append(left - right)
            elif token == "*":
                stack.append(left * right)
            elif token == "/":
                stack.append(left / right)
            else:
                stack.append(left**right)
        elif is_number(token):
            stack.append(float(token) if "." in token else int(token))
        elif token in env:
            stack.append(env[token])
        else:
            raise NameError(token)
    if len(stack) != 1:
        raise ValueError("malformed expression")
    return stack[0]


def evaluate(source, env=None):
    """Tokenize, convert and evaluate ``source``."""
    return eval_rpn(to_rpn(tokenize(source)), env)


def balanced(source):
    """True when every ``(`` has a matching ``)`` after it."""
    depth = 0
    for char in source:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def variables(source):
    """Distinct names used in ``source``, in order of first use."""
    seen = []
    for token in tokenize(source):
        if (token[0].isalpha() or token[0] == "_") and token not in seen:
            seen.append(token)
    return seen


def count_tokens(source):
    """How many tokens of each kind: ``{"number": .., "name": .., "operator": .., "paren": ..}``."""
    counts = {"number": 0, "name": 0, "operator": 0, "paren": 0}
    for token in tokenize(source):
        if is_number(token):
            counts["number"] += 1
        elif token in OPERATORS:
            counts["operator"] += 1
        elif token in "()":
            counts["paren"] += 1
        else:
            counts["name"] += 1
    return counts
