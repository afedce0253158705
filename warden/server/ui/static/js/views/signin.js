// Sign in with an API token. It is kept in this tab's sessionStorage (gone when the tab
// closes), sent only in the Authorization header, and never put in a URL: the input has no
// name, so even a form submitted without this script sends nothing.

import { ApiError, api, signIn, signOut } from "../api.js";
import { h, swap } from "../dom.js";

export default {
  mount(root, _params, ctx) {
    const refused = sessionStorage.getItem("warden.refused");
    sessionStorage.removeItem("warden.refused");
    const input = h("input", {
      id: "signin-token",
      type: "password",
      autocomplete: "off",
      spellcheck: "false",
      required: true,
      "aria-describedby": "signin-help",
    });
    const message = h("div", { id: "signin-message", "aria-live": "assertive" });
    const button = h("button", { type: "submit", id: "signin-submit" }, "Sign in");
    const form = h(
      "form",
      { class: "signin", method: "post", action: "#", novalidate: true },
      h("h1", null, "Sign in to warden"),
      h("label", { for: "signin-token" }, "API token"),
      input,
      h(
        "p",
        { id: "signin-help", class: "help" },
        "The token you use with the CLI (WARDEN_TOKEN), or one an admin made with ",
        h("code", null, "warden token create"),
        ". It stays in this browser tab until you sign out or close the tab.",
      ),
      button,
      message,
    );
    if (refused) swap(message, h("p", { class: "notice notice-error", role: "alert" }, "The server refused the token: sign in again."));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const value = input.value.trim();
      if (!value) {
        swap(message, h("p", { class: "notice notice-error", role: "alert" }, "Enter a token."));
        input.focus();
        return;
      }
      button.disabled = true;
      swap(message, h("p", { class: "notice", role: "status" }, "Checking the token…"));
      signIn(value);
      try {
        await api("/queues");
        input.value = "";
        await ctx.signedIn();
      } catch (err) {
        signOut();
        const text =
          err instanceof ApiError && err.status === 401 ? "The server does not know this token (or it was revoked)." : `Could not sign in: ${err.message}`;
        swap(message, h("p", { class: "notice notice-error", role: "alert" }, text));
        sessionStorage.removeItem("warden.refused");
        button.disabled = false;
        input.focus();
      }
    });
    root.append(h("section", { class: "signin-page" }, form));
    setTimeout(() => input.focus(), 0);
    return { title: "Sign in", static: true };
  },
};
