"""TGI's `/vertex` and `/chat_tokenize` through the real server: a Vertex instance generates what
its own route generates, and `/chat_tokenize` gives the ids the chat route serves."""
import requests

CHAT = {"messages": [{"role": "system", "content": "Answer briefly."},
                     {"role": "user", "content": "Name a primary colour."}], "max_tokens": 6}


def post(url, path, body):
    response = requests.post(url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_vertex_instances_generate_what_their_own_routes_do(url):
    # Greedy, so each instance's text is its route's text.
    generate = {"inputs": "The three primary colors are", "parameters": {"max_new_tokens": 6}}
    chat = {**CHAT, "temperature": 0}
    predictions = post(url, "/vertex", {"instances": [generate, chat, {**generate, "parameters": {
        "max_new_tokens": 6, "return_full_text": True}}]})["predictions"]
    generated = post(url, "/generate", generate)["generated_text"]
    answered = post(url, "/v1/chat/completions", chat)["choices"][0]["message"]["content"]
    assert predictions == [generated, answered, generate["inputs"] + generated]


def test_vertex_refuses_a_bad_instance_with_tgis_error_shape(url):
    response = requests.post(url + "/vertex", json={"instances": [{"inputs": "x", "parameters": {
        "max_new_tokens": 0}}]}, timeout=60)
    assert response.status_code == 422
    assert response.json() == {"error": "Input validation error: `max_new_tokens` must be strictly positive",
                               "error_type": "validation"}


def test_chat_tokenize_gives_the_ids_the_chat_route_serves(url):
    tokenized = post(url, "/chat_tokenize", CHAT)
    text, tokens = tokenized["templated_text"], tokenized["tokenize_response"]
    assert "Name a primary colour." in text
    assert "".join(token["text"] for token in tokens) == text
    rendered = post(url, "/v1/chat/completions/render", CHAT)["token_ids"]
    assert [token["id"] for token in tokens] == rendered
    usage = post(url, "/v1/chat/completions", CHAT)["usage"]
    assert usage["prompt_tokens"] == len(tokens)
