// Checks an edit form in the page before it is sent: each field's own constraints
// (required, min, max, length, pattern) and JSON text areas, with the message
// shown next to its field. The server checks the payload against the schema
// again and shows its violations in the same places. Keeps the list of open
// interrupts current: every second, while the tab is visible, it fetches the
// same page and swaps in its list. Keeps an open interrupt's page honest: every
// second it asks the interrupt's state, and once someone decided elsewhere (or
// the deadline passed) it replaces the buttons with who decided what and when,
// so nobody clicks a decision that can no longer apply. No inline handlers:
// the page's Content-Security-Policy allows this file only.
"use strict";

function showViolation(form, name, message) {
  const slot = form.querySelector('.violation[data-for="' + CSS.escape(name) + '"]');
  if (slot) slot.textContent = message;
}

function checkForm(form) {
  let ok = true;
  for (const input of form.querySelectorAll("input[name^='field:'], select, textarea")) {
    const name = input.name.startsWith("field:") ? input.name.slice(6) : input.name;
    let message = "";
    if (!input.checkValidity()) {
      message = input.validationMessage;
    } else if (input.hasAttribute("data-json") && input.value.trim() !== "") {
      try { JSON.parse(input.value); } catch (e) { message = "not valid JSON: " + e.message; }
    }
    showViolation(form, name, message);
    if (message) ok = false;
  }
  return ok;
}

async function refreshList(region) {
  if (document.hidden) return;
  try {
    const answer = await fetch(location.href, {credentials: "same-origin", cache: "no-store"});
    if (!answer.ok) return;
    const page = new DOMParser().parseFromString(await answer.text(), "text/html");
    const fresh = page.querySelector("[data-live]");
    if (fresh) region.replaceWith(document.adoptNode(fresh));
  } catch (e) {
    // The next tick tries again: a restarting server is not the reviewer's problem.
  }
}

// The decide section of an open interrupt, replaced by what closed it: built with
// textContent only (the summary holds the decider's name, a caller's value).
function closeDecision(section, state) {
  const outcome = document.createElement("div");
  outcome.className = "outcome elsewhere";
  outcome.setAttribute("role", "status");
  const winner = document.createElement("p");
  winner.className = "winner";
  winner.textContent = state.open ? "This review was asked again." : state.summary;
  const next = document.createElement("p");
  next.className = "meta";
  next.append(state.open ? "It changed while this page was open. "
                         : "This was settled elsewhere while this page was open. ");
  const reload = document.createElement("a");
  reload.href = location.pathname;
  reload.textContent = "Reload";
  next.append(reload, state.open ? " to see what is asked now." : " for the details.");
  outcome.append(winner, next);
  section.replaceWith(outcome);
}

function watchDecision(section) {
  const timer = setInterval(async () => {
    if (document.hidden) return;
    // A decision this page is sending is shown by the page that answers it.
    if (section.querySelector("form[data-sent]") || !section.isConnected) {
      clearInterval(timer);
      return;
    }
    try {
      const answer = await fetch(section.dataset.state,
                                 {credentials: "same-origin", cache: "no-store"});
      if (!answer.ok) return;
      const state = await answer.json();
      if (state.open && String(state.requested) === section.dataset.requested) return;
      if (section.querySelector("form[data-sent]")) return;
      clearInterval(timer);
      closeDecision(section, state);
    } catch (e) {
      // The next tick tries again, as the list does.
    }
  }, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  const decide = document.querySelector("section.decide[data-state]");
  if (decide) watchDecision(decide);
  if (document.querySelector("[data-live]")) {
    setInterval(() => {
      const region = document.querySelector("[data-live]");
      if (region) refreshList(region);
    }, 1000);
  }
  for (const form of document.querySelectorAll("form[data-validate]")) {
    form.addEventListener("submit", (event) => {
      if (!checkForm(form)) event.preventDefault();
    });
  }
  // A second click while the first decision is on its way sends nothing new.
  for (const form of document.querySelectorAll("form.actions, form.edit")) {
    form.addEventListener("submit", (event) => {
      if (event.defaultPrevented) return;
      if (form.dataset.sent) { event.preventDefault(); return; }
      form.dataset.sent = "1";
    });
  }
});
